"""Forward (noising) processes for MDLM training: standard and TRIMS trajectory masking.

Pure tensor functions: they know token ids, which positions may be masked and bucket ids, nothing of
tokenizers or models. Both processes are written as "a masking probability per token" compared with
one uniform draw per token, so with ``trajectory_ratio = 0`` TRIMS consumes the random stream exactly
like standard MDLM and produces identical masks for the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..settings import MaskingConfig, TrajectoryLossWeight


class NoiseSchedule(Protocol):
    """``alpha(t)``: probability that a token is still clean at time t; ``weight(t)`` = -alpha'(t) / (1 - alpha(t))."""

    def alpha(self, t: torch.Tensor) -> torch.Tensor: ...

    def weight(self, t: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class LinearSchedule:
    """alpha_t = 1 - t (LLaDA, Dream and the paper): mask probability t, ELBO weight 1/t."""

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 - t

    def weight(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 / t


@dataclass(frozen=True)
class CosineSchedule:
    """alpha_t = cos(pi t / 2): fewer masks early in t; ELBO weight (pi/2) sin(pi t/2) / (1 - cos(pi t/2))."""

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cos(0.5 * math.pi * t)

    def weight(self, t: torch.Tensor) -> torch.Tensor:
        half = 0.5 * math.pi * t
        return 0.5 * math.pi * torch.sin(half) / (1.0 - torch.cos(half))


SCHEDULES: dict[str, NoiseSchedule] = {"linear": LinearSchedule(), "cosine": CosineSchedule()}


def get_schedule(name: str) -> NoiseSchedule:
    if name not in SCHEDULES:
        raise ValueError(f"Unknown noise schedule {name!r}; choose one of {sorted(SCHEDULES)}.")
    return SCHEDULES[name]


Generators = torch.Generator | Sequence[torch.Generator] | None
"""One generator for the whole batch, or one per row (then a row's draws do not depend on its batch-mates)."""


def uniform(generator: Generators, batch_size: int, *size: int) -> torch.Tensor:
    """U[0, 1) draws of shape [batch_size, *size]; with one generator per row, row b comes from generator b."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand(batch_size, *size, generator=generator)
    if len(generator) != batch_size:
        raise ValueError(f"Got {len(generator)} generators for {batch_size} rows.")
    return torch.stack([torch.rand(size, generator=row) for row in generator])


@dataclass
class NoisedBatch:
    """The result of one draw of the forward process for a batch."""

    input_ids: torch.Tensor  # [B, L] with masked positions replaced by the mask id
    masked: torch.Tensor  # [B, L] bool: positions that were masked (exactly the loss positions)
    t: torch.Tensor  # [B] sampled diffusion time
    bucket_threshold: torch.Tensor  # [B] sampled k (-1 for standard samples)
    is_trajectory: torch.Tensor  # [B] bool
    loss_weights: torch.Tensor  # [B] per-sample weight applied to the summed cross-entropy


def mask_probabilities(
    maskable: torch.Tensor,
    bucket_ids: torch.Tensor,
    is_trajectory: torch.Tensor,
    t: torch.Tensor,
    bucket_threshold: torch.Tensor,
    schedule: NoiseSchedule,
    p_context: float,
    p_future: float,
) -> torch.Tensor:
    """Per-token masking probability: ``1 - alpha_t`` for standard samples; Algorithm 1 for trajectory ones.

    Trajectory samples: tokens whose bucket ``b <= k`` are context (``p_context``), ``b > k`` are future
    (``p_future``). Positions that are not maskable (prompt) get probability 0.
    """
    standard = (1.0 - schedule.alpha(t)).unsqueeze(1).expand_as(bucket_ids).to(torch.float32)
    future = bucket_ids > bucket_threshold.unsqueeze(1)
    trajectory = torch.where(future, p_future, p_context).to(torch.float32)
    probabilities = torch.where(is_trajectory.unsqueeze(1), trajectory, standard)
    return probabilities * maskable


def trajectory_weights(
    kind: TrajectoryLossWeight, t: torch.Tensor, masked: torch.Tensor, maskable: torch.Tensor, schedule: NoiseSchedule
) -> torch.Tensor:
    """Loss weight of trajectory samples.

    ``elbo`` (default, Algorithm 1): the sampled t's weight -alpha'_t/(1-alpha_t) even though the mask
    pattern no longer follows t. ``inverse_mask_ratio``: 1 / (fraction of maskable tokens actually masked),
    0 when nothing was masked. ``none``: 1.
    """
    if kind == "elbo":
        return schedule.weight(t)
    if kind == "inverse_mask_ratio":
        ratio = masked.sum(1) / maskable.sum(1).clamp(min=1)
        return torch.where(ratio > 0, 1.0 / ratio.clamp(min=1e-12), torch.zeros_like(ratio))
    if kind == "none":
        return torch.ones_like(t)
    raise ValueError(f"Unknown trajectory_loss_weight {kind!r}; choose 'elbo', 'inverse_mask_ratio' or 'none'.")


def check_noise_inputs(input_ids: torch.Tensor, maskable: torch.Tensor, bucket_ids: torch.Tensor,
                       is_trajectory: torch.Tensor, mask_token_id: int) -> None:
    """The shapes and kinds :func:`noise_batch` reads, checked without a device sync: broadcasting would spread one
    row's flag or mask over the batch, and a float ``maskable`` would scale the probabilities."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids {tuple(input_ids.shape)}: [batch, length].")
    for name, tensor in (("maskable", maskable), ("bucket_ids", bucket_ids)):
        if tuple(tensor.shape) != tuple(input_ids.shape):
            raise ValueError(f"{name} {tuple(tensor.shape)}: the shape of input_ids {tuple(input_ids.shape)}.")
    if bucket_ids.dtype == torch.bool or bucket_ids.is_floating_point() or bucket_ids.is_complex():
        raise ValueError(f"bucket_ids ({bucket_ids.dtype}): whole-number bucket ids, an integer tensor.")
    if maskable.dtype != torch.bool or is_trajectory.dtype != torch.bool:
        raise ValueError(f"maskable ({maskable.dtype}) and is_trajectory ({is_trajectory.dtype}) are bool tensors.")
    if tuple(is_trajectory.shape) != tuple(input_ids.shape[:1]):
        raise ValueError(f"is_trajectory {tuple(is_trajectory.shape)}: one flag per row, ({input_ids.shape[0]},).")
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int) or mask_token_id < 0:
        raise ValueError(f"mask_token_id={mask_token_id!r}: a token id, a whole number >= 0.")


def check_bucket_range(bucket_ids: torch.Tensor, maskable: torch.Tensor, is_trajectory: torch.Tensor,
                       num_buckets: int) -> None:
    """A trajectory row's maskable tokens lie in buckets ``0..K-1``: an id of K or more (rows cut for a larger K) would
    always read as future, -1 always as context, and the masks would look plausible. Other positions are not read.
    One check of the whole batch (a device sync where the batch is on an accelerator; the collator's is on the CPU)."""
    read = maskable & is_trajectory.unsqueeze(1).to(maskable.device)
    outside = read & ((bucket_ids < 0) | (bucket_ids >= num_buckets))
    if outside.any():
        row, position = (int(i) for i in outside.nonzero()[0])
        value = int(bucket_ids[row, position])
        cause = ("rows cut for another K need that num_buckets" if value >= num_buckets else
                 "a maskable response token needs its bucket (-1 marks the prompt)")
        raise ValueError(f"bucket_ids: row {row}, position {position} holds {value}, outside num_buckets={num_buckets} "
                         f"(ids 0..{num_buckets - 1}); {cause}.")


def noise_batch(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    bucket_ids: torch.Tensor,
    is_trajectory: torch.Tensor,
    *,
    mask_token_id: int,
    config: MaskingConfig,
    generator: Generators = None,
) -> NoisedBatch:
    """Draw one noised version of a batch with the forward process ``config`` describes.

    Every sample gets ``t ~ U(min_t, 1)`` and ``k ~ U{0..K-1}``; ``is_trajectory`` picks which of the
    two processes uses them. Standard samples are weighted by the schedule's ELBO weight at t. A sample
    that ends up with no masked token contributes zero loss (its tokens still count in a "token"
    normaliser, which keeps the estimator unbiased).
    """
    check_noise_inputs(input_ids, maskable, bucket_ids, is_trajectory, mask_token_id)
    check_bucket_range(bucket_ids, maskable, is_trajectory, config.num_buckets)
    batch_size, length = input_ids.shape
    schedule = get_schedule(config.noise_schedule)
    t = config.min_t + (1.0 - config.min_t) * uniform(generator, batch_size)
    k = (uniform(generator, batch_size) * config.num_buckets).long().clamp(max=config.num_buckets - 1)
    draws = uniform(generator, batch_size, length)  # per-row generators: draw i does not depend on the width
    t, k, draws = t.to(input_ids.device), k.to(input_ids.device), draws.to(input_ids.device)
    is_trajectory = is_trajectory.to(input_ids.device)
    probabilities = mask_probabilities(maskable, bucket_ids, is_trajectory, t, k, schedule, config.p_context, config.p_future)
    masked = draws < probabilities
    weights = torch.where(
        is_trajectory,
        trajectory_weights(config.trajectory_loss_weight, t, masked, maskable, schedule),
        schedule.weight(t),
    )
    return NoisedBatch(
        input_ids=torch.where(masked, torch.full_like(input_ids, mask_token_id), input_ids),
        masked=masked,
        t=t,
        bucket_threshold=torch.where(is_trajectory, k, torch.full_like(k, -1)),
        is_trajectory=is_trajectory,
        loss_weights=weights.to(torch.float32),
    )


def select_per_draw(batch_size: int, ratio: float, generator: Generators = None) -> torch.Tensor:
    """Each sample independently gets trajectory masking with probability ``ratio`` at every draw."""
    return uniform(generator, batch_size) < ratio


def select_fixed_subset(example_ids: torch.Tensor, ratio: float, seed: int) -> torch.Tensor:
    """A fixed subset: example ``i`` is a trajectory example iff hash(seed, i) / 2^32 < ratio, at every epoch.

    The hash (a 64-bit mix of the id and the seed) makes membership independent of batch order and
    process count, and selects about ``ratio`` of the examples.
    """
    x = example_ids.to(torch.int64) * 0x9E3779B1 + seed * 0x85EBCA77 + 0x165667B1
    x = (x ^ (x >> 15)) * 0x2C1B3C6D
    x = (x ^ (x >> 12)) * 0x297A2D39
    x = x ^ (x >> 15)
    return (x & 0xFFFFFFFF).to(torch.float64) / 2**32 < ratio
