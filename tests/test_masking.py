"""Statistics and semantics of the standard and trajectory forward processes (pure tensors)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trims_hf import MaskingConfig
from trims_hf.training.masking import (
    CosineSchedule,
    LinearSchedule,
    noise_batch,
    select_fixed_subset,
    select_per_draw,
    uniform,
)

MASK = 999


def binomial_tolerance(p: float, n: int, sigmas: float = 5.0) -> float:
    return sigmas * math.sqrt(p * (1 - p) / n)


def batch(batch_size=512, length=64, prompt=16, num_buckets=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 500, (batch_size, length), generator=g)
    maskable = torch.zeros(batch_size, length, dtype=torch.bool)
    maskable[:, prompt:] = True
    buckets = torch.randint(0, num_buckets, (batch_size, length), generator=g)
    buckets[:, :prompt] = -1
    return ids, maskable, buckets


def test_prompt_never_masked_and_mask_token_placed():
    ids, maskable, buckets = batch()
    for trajectory in (True, False):
        out = noise_batch(ids, maskable, buckets, torch.full((len(ids),), trajectory), mask_token_id=MASK, config=MaskingConfig(),
                          generator=torch.Generator().manual_seed(1))
        assert not out.masked[~maskable].any()
        assert torch.equal(out.input_ids[out.masked], torch.full((int(out.masked.sum()),), MASK))
        assert torch.equal(out.input_ids[~out.masked], ids[~out.masked])


def test_standard_mask_ratio_follows_t():
    ids, maskable, buckets = batch(batch_size=2048)
    out = noise_batch(ids, maskable, buckets, torch.zeros(len(ids), dtype=torch.bool), mask_token_id=MASK, config=MaskingConfig(),
                      generator=torch.Generator().manual_seed(2))
    ratio = out.masked.sum(1).float() / maskable.sum(1)
    # E[ratio] = E[t] ~= 0.5 for t ~ U(1e-3, 1); per-sample ratio tracks t.
    assert abs(ratio.mean().item() - 0.5) < 0.02
    assert torch.corrcoef(torch.stack([ratio, out.t]))[0, 1] > 0.95
    assert torch.all((out.t >= 1e-3) & (out.t <= 1))
    assert torch.allclose(out.loss_weights, 1 / out.t)
    assert torch.all(out.bucket_threshold == -1)


def test_trajectory_context_and_future_rates():
    ids, maskable, buckets = batch(batch_size=2048)
    out = noise_batch(ids, maskable, buckets, torch.ones(len(ids), dtype=torch.bool), mask_token_id=MASK,
                      config=MaskingConfig(p_context=0.05, p_future=0.95), generator=torch.Generator().manual_seed(3))
    k = out.bucket_threshold.unsqueeze(1)
    context = maskable & (buckets <= k)
    future = maskable & (buckets > k)
    rate_context = out.masked[context].float().mean().item()
    rate_future = out.masked[future].float().mean().item()
    assert abs(rate_context - 0.05) < binomial_tolerance(0.05, int(context.sum()))
    assert abs(rate_future - 0.95) < binomial_tolerance(0.95, int(future.sum()))
    # k ~ U{0..K-1}
    counts = torch.bincount(out.bucket_threshold, minlength=8).float() / len(ids)
    assert torch.all((counts - 1 / 8).abs() < binomial_tolerance(1 / 8, len(ids)))
    # default weight: the sampled t's ELBO weight, although the pattern ignores t
    assert torch.allclose(out.loss_weights, 1 / out.t)


@pytest.mark.parametrize("settings,error,match", [
    ({"p_future": 0.0}, ValueError, r"^p_future=0\.0: trajectory samples would mask nothing \(p_context may not exceed it\)"),
    ({"p_context": 0.99, "p_future": 0.01}, ValueError,
     r"^p_context=0\.99 above p_future=0\.01: a trajectory sample keeps its context .* swap them\.$"),
    ({"pad_to_multiple_of": -8}, ValueError, r"^pad_to_multiple_of=-8: must be at least 1 \(or unset\)\.$"),
    ({"num_buckets": 1}, ValueError, r"^num_buckets=1 with trajectory_ratio=0\.1: one bucket holds every token, so a "
     r"trajectory sample has no future to hide"),
    ({"pad_to_multiple_of": 0}, ValueError, r"^pad_to_multiple_of=0: must be at least 1"),
    ({"num_buckets": 2.5}, TypeError, r"^num_buckets=2\.5: must be a whole number \(int\), not float\.$"),
    ({"num_buckets": "8"}, TypeError, r"^num_buckets='8': must be a whole number \(int\), not str\.$"),
    ({"num_buckets": True}, TypeError, r"^num_buckets=True: must be a whole number \(int\), not bool\.$"),
    ({"pad_to_multiple_of": 8.0}, TypeError, r"^pad_to_multiple_of=8\.0: must be a whole number"),
    ({"bucket_seed": None}, TypeError, r"^bucket_seed=None: must be a whole number"),
    ({"p_context": "0.05"}, TypeError, r"^p_context='0\.05': must be a number, not str\.$"),
    ({"train_on_padding": "false"}, TypeError, r"^train_on_padding='false': must be true or false \(a bool\), not str\.$"),
    ({"train_on_padding": 0}, TypeError, r"^train_on_padding=0: must be true or false"),
])
def test_masking_settings_refused_when_set(settings, error, match):
    with pytest.raises(error, match=match):
        MaskingConfig(**settings)


def test_masking_settings_accepted_at_their_edges():
    """Equal rates are the control without an ordering; numpy whole numbers are whole numbers."""
    assert MaskingConfig(p_context=0.5, p_future=0.5).p_future == 0.5
    assert MaskingConfig(p_context=0, p_future=1, num_buckets=np.int64(4), pad_to_multiple_of=1).num_buckets == 4
    assert MaskingConfig(num_buckets=1, trajectory_ratio=0).num_buckets == 1  # the MDLM baseline reads no bucket
    assert MaskingConfig(num_buckets=2).num_buckets == 2


def test_trajectory_weight_options():
    ids, maskable, buckets = batch(batch_size=64)
    flags = torch.ones(len(ids), dtype=torch.bool)
    ratio_out = noise_batch(ids, maskable, buckets, flags, mask_token_id=MASK,
                            config=MaskingConfig(trajectory_loss_weight="inverse_mask_ratio"),
                            generator=torch.Generator().manual_seed(4))
    actual = ratio_out.masked.sum(1).float() / maskable.sum(1)
    assert torch.allclose(ratio_out.loss_weights, torch.where(actual > 0, 1 / actual, 0.0))
    none_out = noise_batch(ids, maskable, buckets, flags, mask_token_id=MASK,
                           config=MaskingConfig(trajectory_loss_weight="none"), generator=torch.Generator().manual_seed(4))
    assert torch.all(none_out.loss_weights == 1)
    # nothing masked (every token in bucket 0, so context, with p_context 0) -> weight 0 under inverse_mask_ratio (no inf)
    empty = noise_batch(ids, maskable, torch.zeros_like(buckets), flags, mask_token_id=MASK,
                        config=MaskingConfig(p_context=0.0, trajectory_loss_weight="inverse_mask_ratio"),
                        generator=torch.Generator().manual_seed(4))
    assert not empty.masked.any() and torch.all(empty.loss_weights == 0)


def test_same_seed_same_masks_and_ratio_zero_equals_standard():
    ids, maskable, buckets = batch(batch_size=32)
    standard = torch.zeros(32, dtype=torch.bool)
    a = noise_batch(ids, maskable, buckets, standard, mask_token_id=MASK, config=MaskingConfig(),
                    generator=torch.Generator().manual_seed(5))
    b = noise_batch(ids, maskable, buckets, standard, mask_token_id=MASK, config=MaskingConfig(),
                    generator=torch.Generator().manual_seed(5))
    c = noise_batch(ids, maskable, buckets, standard, mask_token_id=MASK, config=MaskingConfig(),
                    generator=torch.Generator().manual_seed(6))
    assert torch.equal(a.masked, b.masked) and torch.equal(a.t, b.t)
    assert not torch.equal(a.masked, c.masked)
    # mixing in trajectory samples leaves the standard samples' masks unchanged (one shared random stream)
    mixed = standard.clone()
    mixed[::4] = True
    d = noise_batch(ids, maskable, buckets, mixed, mask_token_id=MASK, config=MaskingConfig(),
                    generator=torch.Generator().manual_seed(5))
    assert torch.equal(d.masked[~mixed], a.masked[~mixed])


def test_per_row_generators_draw_each_row_as_if_alone():
    ids, maskable, buckets = batch(batch_size=4)
    flags = torch.tensor([True, False, True, False])

    def generators(*seeds):
        return [torch.Generator().manual_seed(seed) for seed in seeds]

    together = noise_batch(ids, maskable, buckets, flags, mask_token_id=MASK, config=MaskingConfig(),
                           generator=generators(0, 1, 2, 3))
    for b in range(4):
        alone = noise_batch(ids[b:b + 1], maskable[b:b + 1], buckets[b:b + 1], flags[b:b + 1], mask_token_id=MASK,
                            config=MaskingConfig(), generator=generators(b))
        assert torch.equal(alone.masked[0], together.masked[b]) and alone.t[0] == together.t[b]
    assert len(set(together.t.tolist())) == 4
    with pytest.raises(ValueError, match="Got 3 generators for 4 rows"):
        uniform(generators(0, 1, 2), 4)


def test_selection_rules():
    draws = torch.stack([select_per_draw(1000, 0.1, torch.Generator().manual_seed(s)) for s in range(20)])
    share = draws.float().mean().item()
    assert abs(share - 0.1) < binomial_tolerance(0.1, draws.numel())
    assert not torch.equal(draws[0], draws[1])  # fresh draw each time
    ids = torch.arange(20000)
    fixed = select_fixed_subset(ids, 0.1, seed=0)
    assert abs(fixed.float().mean().item() - 0.1) < binomial_tolerance(0.1, len(ids))
    assert torch.equal(fixed, select_fixed_subset(ids.flip(0), 0.1, seed=0).flip(0))  # order-independent
    assert not torch.equal(fixed, select_fixed_subset(ids, 0.1, seed=1))


@pytest.mark.parametrize("schedule", [LinearSchedule(), CosineSchedule()])
def test_schedule_weight_is_elbo_weight(schedule):
    t = torch.linspace(0.05, 0.95, 19, dtype=torch.float64).requires_grad_()
    alpha = schedule.alpha(t)
    (derivative,) = torch.autograd.grad(alpha.sum(), t)
    assert torch.allclose(schedule.weight(t.detach()), -derivative / (1 - alpha.detach()))


NOISE_MISUSES = {
    "one flag for two rows": (dict(is_trajectory=torch.ones(1, dtype=torch.bool)),
                              r"is_trajectory \(1,\): one flag per row, \(2,\)"),
    "maskable of one row": (dict(maskable=torch.ones(1, 8, dtype=torch.bool)),
                            r"maskable \(1, 8\): the shape of input_ids \(2, 8\)"),
    "float maskable": (dict(maskable=torch.full((2, 8), 0.5)), r"maskable \(torch\.float32\) and is_trajectory "
                                                               r"\(torch\.bool\) are bool tensors"),
    "buckets of another width": (dict(bucket_ids=torch.zeros(2, 7, dtype=torch.long)), r"bucket_ids \(2, 7\)"),
    "float buckets": (dict(bucket_ids=torch.full((2, 8), 0.5)), r"bucket_ids \(torch\.float32\): whole-number"),
    "bool buckets": (dict(bucket_ids=torch.zeros(2, 8, dtype=torch.bool)), r"bucket_ids \(torch\.bool\): whole-number"),
    "one row, 1-D": (dict(input_ids=torch.arange(8)), r"input_ids \(8,\): \[batch, length\]"),
    "a negative mask id": (dict(mask_token_id=-1), r"mask_token_id=-1: a token id"),
    "a fractional mask id": (dict(mask_token_id=2.5), r"mask_token_id=2\.5: a token id"),
}


@pytest.mark.parametrize("case", NOISE_MISUSES)
def test_noise_batch_refuses_inputs_it_would_broadcast(case):
    """Broadcast, these drew plausible masks: one row's trajectory flag for the batch, a float maskable scaling the
    probabilities, a mask id of -1 written into the inputs."""
    inputs = dict(input_ids=torch.arange(16).view(2, 8), maskable=torch.ones(2, 8, dtype=torch.bool),
                  bucket_ids=torch.zeros(2, 8, dtype=torch.long), is_trajectory=torch.tensor([True, False]),
                  mask_token_id=MASK, config=MaskingConfig())
    assert noise_batch(**inputs).input_ids.shape == (2, 8)
    changed, message = NOISE_MISUSES[case]
    with pytest.raises(ValueError, match=message):
        noise_batch(**{**inputs, **changed})


@pytest.mark.parametrize(("bucket", "row", "refused"), [(8, 0, True), (-1, 0, True), (12, 1, False), (7, 0, False)])
def test_noise_batch_refuses_a_trajectory_token_outside_the_buckets(bucket, row, refused):
    """Bucket K or more would always read as future, -1 always as context; a standard row's ids and the prompt's are
    not read, so they pass."""
    maskable = torch.ones(2, 8, dtype=torch.bool)
    maskable[:, :3] = False
    bucket_ids = torch.full((2, 8), 3)
    bucket_ids[:, :3] = -1
    bucket_ids[row, 5] = bucket
    inputs = dict(input_ids=torch.arange(16).view(2, 8), maskable=maskable, bucket_ids=bucket_ids,
                  is_trajectory=torch.tensor([True, False]), mask_token_id=MASK, config=MaskingConfig(num_buckets=8))
    if not refused:
        assert noise_batch(**inputs).input_ids.shape == (2, 8)
        return
    cause = "rows cut for another K need that num_buckets" if bucket > 0 else "a maskable response token needs its"
    with pytest.raises(ValueError, match=rf"^bucket_ids: row 0, position 5 holds {bucket}, outside num_buckets=8 "
                                         rf"\(ids 0\.\.7\); {cause}"):
        noise_batch(**inputs)


@pytest.mark.parametrize("block_size", [0, -2, 2.5, True])
def test_a_block_mask_needs_a_whole_block_size(block_size):
    from trims_hf import block_diffusion_mask

    with pytest.raises(ValueError, match=rf"^block_size={block_size!r}: a whole number of positions >= 1\.$"):
        block_diffusion_mask(4, block_size)
    assert block_diffusion_mask(4, 2).shape == (8, 8)
