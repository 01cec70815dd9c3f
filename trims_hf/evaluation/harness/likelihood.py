"""Monte Carlo log-likelihood of a continuation under a masked-diffusion student.

A masked-diffusion model has no left-to-right factorisation, so ``log p(continuation | context)`` is
replaced by its ELBO, estimated as in LLaDA (Nie et al. 2025, Eq. 6, the lower-variance form): draw the
number of masks ``l`` uniformly from ``{1..L}`` (``L`` continuation tokens), mask a uniformly random
subset of ``l`` continuation positions (the context stays visible), and score

    (L / l) * sum over masked positions i of log p(x_i | visible tokens)

i.e. the cross-entropy on the masked tokens weighted by ``1/t`` with ``t = l / L``. The estimate is the
mean over ``samples`` independent draws; its expectation is the ELBO (a lower bound on the log-likelihood).
A block-diffusion student (LLaDA 2.x) reads its logits from its training view (:mod:`trims_hf.students.block_diffusion`):
each block of the noised sequence given the clean blocks before it, the block-diffusion ELBO it was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ...students import mask_token_id, student_logits, student_spec
from ...students.block_diffusion import block_diffusion_inputs


def sample_mask_patterns(length: int, samples: int, generator: torch.Generator) -> torch.Tensor:
    """``[samples, length]`` bool: each row masks ``l ~ U{1..length}`` positions chosen uniformly."""
    counts = torch.randint(1, length + 1, (samples,), generator=generator)
    order = torch.rand(samples, length, generator=generator).argsort(dim=1)
    ranks = order.argsort(dim=1)  # a uniformly random permutation per row
    return ranks < counts[:, None]


@torch.no_grad()
def masked_elbo_terms(
    model: nn.Module, context: Sequence[int], continuation: Sequence[int], masks: torch.Tensor
) -> torch.Tensor:
    """``(L / l) * sum log p(masked tokens)`` for every mask pattern row of ``masks`` (``[S, L]`` bool)."""
    device = next(model.parameters()).device
    sequence = torch.tensor([*context, *continuation], device=device)
    target = sequence[len(context) :]
    masks = masks.to(device)
    noisy = sequence.repeat(len(masks), 1)
    noisy[:, len(context) :] = torch.where(masks, mask_token_id(model), target)
    block_size = student_spec(model).block_size
    if block_size is None:
        logits = student_logits(model, noisy)
    else:  # unshifted: the noised half's logits predict its own tokens
        logits = model(**block_diffusion_inputs(noisy, sequence.expand_as(noisy), block_size)).logits[:, : len(sequence)]
    logits = logits[:, len(context) :].float()
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, target.expand(len(masks), -1)[..., None]).squeeze(-1)
    weight = len(continuation) / masks.sum(dim=1)
    return weight * (log_probs * masks).sum(dim=1)


def masked_diffusion_loglikelihood(
    model: nn.Module,
    context: Sequence[int],
    continuation: Sequence[int],
    samples: int = 128,
    batch_size: int = 32,
    generator: torch.Generator | None = None,
) -> float:
    """Mean of ``samples`` Monte Carlo ELBO terms (see the module docstring), ``batch_size`` per forward."""
    if not continuation:
        raise ValueError("The continuation to score is empty.")
    if not context:
        raise ValueError("The context is empty; masked-diffusion scoring needs at least one visible token.")
    generator = generator or torch.Generator().manual_seed(0)
    masks = sample_mask_patterns(len(continuation), samples, generator)
    terms = [masked_elbo_terms(model, context, continuation, chunk) for chunk in masks.split(batch_size)]
    return float(torch.cat(terms).double().mean())
