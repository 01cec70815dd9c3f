"""What the trainer and the decoder need to know about a masked-diffusion student.

A student is an ordinary transformers model plus a small :class:`StudentSpec`: its mask token, whether
its logits are shifted (Dream reads the prediction for token ``i`` at position ``i - 1``), and which
modules LoRA should wrap. The spec is stored on the model config (``config.trims_student``), so it
survives ``save_pretrained`` / PEFT wrapping and every component can recover it from the model alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class StudentSpec:
    """Static facts about one family of masked-diffusion students."""

    kind: str
    """Registry name: ``"llada"``, ``"dream"`` or ``"masked_lm"``."""
    shift_logits: bool
    """True when the logits at position ``i - 1`` predict token ``i`` (Dream)."""
    lora_target_modules: tuple[str, ...] | str
    """Module names (or a peft keyword such as ``"all-linear"``) that LoRA wraps; never the LM head."""
    decoder: bool
    """A transformers causal-LM class made bidirectional (takes position ids, a KV cache and ``logits_to_keep``);
    False for an ``AutoModelForMaskedLM``."""
    native_model_type: str | None = None
    """``model_type`` of the family's original checkpoints, whose config :attr:`translate_config` converts."""
    translate_config: Callable[[dict[str, Any]], Any] | None = None
    """Original ``config.json`` dict -> the equivalent transformers config."""
    key_mapping: Mapping[str, str] | None = None
    """Checkpoint weight renames applied at every load (``from_pretrained(key_mapping=...)``)."""

    def source_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Positions whose logits predict the tokens at ``positions`` (position 0 reads itself)."""
        if not self.shift_logits:
            return positions
        return (positions - 1).clamp(min=0)

    def align_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Return logits where ``[:, i]`` predicts token ``i`` for every student kind."""
        if not self.shift_logits:
            return logits
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def make_bidirectional(model: nn.Module) -> nn.Module:
    """Turn a transformers decoder into a full-attention (non-causal) model, in place.

    ``config.is_causal = False`` makes transformers build a bidirectional padding mask; setting every
    attention module's ``is_causal`` to False stops SDPA from falling back to a causal kernel when no
    mask is needed (no padding).
    """
    configs = {id(model.config): model.config}
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False
        config = getattr(module, "config", None)
        if config is not None:
            configs[id(config)] = config
    for config in configs.values():
        config.is_causal = False
    return model
