"""LoRA configuration per student (paper: r = 32, alpha = 32 on every attention and MLP projection)."""

from __future__ import annotations

from typing import Any

from peft import LoraConfig
from torch import nn

from ..students import student_spec


def lora_config(
    model: nn.Module,
    r: int = 32,
    lora_alpha: int = 32,
    lora_dropout: float = 0.05,
    target_modules: list[str] | str | None = None,
    **kwargs: Any,
) -> LoraConfig:
    """Build the peft ``LoraConfig`` for a student.

    Targets the student's attention and MLP projections and never the LM head (LLaDA's original code
    names its head ``ff_out`` like the MLP output; the native port names it ``lm_head``, so it is not
    matched). ``task_type`` is ``None`` for models without ``prepare_inputs_for_generation``. The
    paper does not state a LoRA dropout; 0.05 is our default.
    """
    spec = student_spec(model)
    targets = target_modules if target_modules is not None else spec.lora_target_modules
    task_type = "CAUSAL_LM" if hasattr(model, "prepare_inputs_for_generation") else None
    return LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        target_modules=list(targets) if isinstance(targets, tuple) else targets,
        task_type=task_type,
        **kwargs,
    )
