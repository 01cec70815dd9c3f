"""Attention annealing: a causal model becomes bidirectional gradually while it learns the MDLM objective.

A pretrained causal LM turned into a masked-diffusion student at once (``prepare_student``) sees every position attend
to the future on its first step, which its weights never saw. DiffuLLaMA (Gong et al., 2025, "Scaling Diffusion
Language Models via Adaptation from Autoregressive Models") anneals instead: at training step ``s`` each query attends
to every earlier position and, in addition, to each later one with probability ``min(1, (s + 1) / anneal_steps)``,
one random pattern per step shared by the batch, so the model is causal at the start and fully bidirectional after
``anneal_steps``. Decoding and evaluation always use the full bidirectional attention the student was prepared with.

:func:`annealed_mask` is the pattern (a pure tensor function); :class:`AttentionAnnealing` applies it to a student's
training forwards through a forward pre-hook, so any trainer (``MDLMTrainer``, a plain ``Trainer``) trains with it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def annealed_mask(seq_len: int, ratio: float, generator: torch.Generator | None = None,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """[seq_len, seq_len] bool, True where a query (row) may attend to a key (column): every key up to the query
    (causal) and each later one with probability ``ratio`` (0: causal, 1: bidirectional)."""
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    if ratio >= 1:
        return torch.ones_like(causal)
    if ratio <= 0:
        return causal
    extra = torch.rand(seq_len, seq_len, generator=generator, device=generator.device if generator else device) < ratio
    return causal | extra.to(device)


class AttentionAnnealing:
    """Make a student's training forwards use :func:`annealed_mask` at the ratio of their optimizer step.

    The step is counted from the training forwards the hook sees (``accumulation`` of them per optimizer step: one
    for the study runner), so the schedule needs no trainer callback. A training forward is one where the module is in
    training mode with gradients on; the 2-D padding mask it receives becomes a 4-D boolean mask (padding keys stay
    hidden; each query keeps itself, so no row is empty). Once the ratio reaches 1 forwards are left as they are.
    """

    def __init__(self, model: nn.Module, anneal_steps: int, accumulation: int = 1, seed: int = 0) -> None:
        if anneal_steps < 1 or accumulation < 1:
            raise ValueError(f"anneal_steps={anneal_steps}, accumulation={accumulation}: both must be at least 1.")
        self.anneal_steps, self.accumulation, self.forwards = anneal_steps, accumulation, 0
        self.generator = torch.Generator().manual_seed(seed)
        self.handle = model.register_forward_pre_hook(self.before, with_kwargs=True)

    def ratio(self) -> float:
        """The share of later keys each query sees at the current optimizer step."""
        return min(1.0, (self.forwards // self.accumulation + 1) / self.anneal_steps)

    def before(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        if not (module.training and torch.is_grad_enabled()):
            return None
        ratio = self.ratio()
        self.forwards += 1
        if ratio >= 1:
            return None
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        batch, seq_len = input_ids.shape
        allowed = annealed_mask(seq_len, ratio, self.generator).to(input_ids.device)
        allowed = allowed | torch.eye(seq_len, dtype=torch.bool, device=input_ids.device)
        padding = kwargs.get("attention_mask")
        mask = allowed.expand(batch, 1, seq_len, seq_len)
        if padding is not None and padding.dim() == 2:
            keys = padding.bool()[:, None, None, :]
            mask = mask & (keys | torch.eye(seq_len, dtype=torch.bool, device=input_ids.device))
        return args, {**kwargs, "attention_mask": mask}

    def remove(self) -> None:
        self.handle.remove()
