"""TrimsDataCollator on prepared rows: layout, truncation, padding, labels, reproducibility, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Dataset

from conftest import synthetic_scored_rows
from trims_hf import MaskingConfig, StudentFormat, TrimsDataCollator, prepare_dataset
from trims_hf.schema import SchemaError


def collator(tokenizer, seed: int = 0, **masking):
    return TrimsDataCollator(tokenizer, masking=MaskingConfig(**masking), seed=seed)


@pytest.fixture(scope="module")
def scored(gsm8k_rows, tokenizer):
    return synthetic_scored_rows(gsm8k_rows[:32], tokenizer)


@pytest.fixture(scope="module")
def prepared(scored, tokenizer):
    return list(prepare_dataset(Dataset.from_list(scored), tokenizer))


def test_batch_layout(scored, prepared, tokenizer):
    out = collator(tokenizer)(prepared[:4])
    ids, labels, response = out["input_ids"], out["labels"], out["response_mask"]
    assert ids.shape == labels.shape == response.shape == out["attention_mask"].shape
    assert out["loss_weights"].shape == out["t"].shape == out["is_trajectory"].shape == (4,)
    for b, row in enumerate(scored[:4]):
        text = tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        p, c = len(prompt_ids), len(completion_ids)
        assert torch.equal(ids[b, :p], torch.tensor(prompt_ids))  # the prompt is never masked
        assert not response[b, :p].any() and response[b, p:].all()  # EOS padding is in the loss
        clean = torch.where(labels[b] != -100, labels[b], ids[b])
        assert clean[p:p + c].tolist() == completion_ids
        assert torch.all(clean[p + c:] == tokenizer.eos_token_id)  # end of response + padding
        masked = ids[b] == tokenizer.mask_token_id
        assert torch.equal(masked, labels[b] != -100)


def test_prepared_buckets_equal_teacher_buckets_for_same_tokenizer(scored, prepared):
    """With teacher tokenizer == student tokenizer, the projection is the identity and the buckets agree."""
    for row, raw in zip(prepared, scored):
        completion = row["bucket_ids"][: len(raw["teacher_bucket"])]
        assert completion == raw["teacher_bucket"]
        assert np.allclose(row["student_score"], raw["teacher_nll"], atol=1e-6)
        assert row["bucket_ids"][len(raw["teacher_bucket"]):] == [7]  # end of response: easiest bucket


def test_truncation_keeps_buckets_aligned_and_equal_mass_over_kept_tokens(scored, prepared, tokenizer):
    cut = max(row["prompt_length"] for row in prepared) + 5
    rows = list(prepare_dataset(Dataset.from_list(scored), tokenizer, StudentFormat(max_length=cut)))
    assert all(len(row["input_ids"]) <= cut for row in rows)
    assert [row["input_ids"] for row in rows] == [row["input_ids"][:cut] for row in prepared]
    kept = np.concatenate([row["bucket_ids"] for row in rows if len(row["input_ids"]) == cut])
    counts = np.bincount(np.concatenate([row["bucket_ids"][: len(row["student_score"])] for row in rows]), minlength=8)
    assert counts.max() - counts.min() <= 1  # quantiles over the tokens training sees, not whole completions
    assert kept.size and 7 in kept
    row = next(row for row in rows if len(row["input_ids"]) == cut)
    buckets = row["bucket_ids"]
    for draw in range(20):
        out = collator(tokenizer, seed=draw, trajectory_ratio=1.0, p_context=0.0, p_future=1.0)([row])
        assert out["input_ids"].shape[1] == cut
        masked = (out["labels"][0] != -100)[row["prompt_length"]:]
        # k is unknown but the masked set must be exactly the tokens above some threshold bucket
        masked_buckets = {b for b, m in zip(buckets, masked.tolist()) if m}
        kept_buckets = {b for b, m in zip(buckets, masked.tolist()) if not m}
        assert not masked_buckets or not kept_buckets or min(masked_buckets) > max(kept_buckets)


def test_ratio_zero_is_plain_mdlm_and_needs_no_scores(gsm8k_rows, prepared, tokenizer):
    plain_rows = list(prepare_dataset(Dataset.from_list(gsm8k_rows[:8]), tokenizer))
    assert "bucket_ids" not in plain_rows[0]
    plain = collator(tokenizer, seed=7, trajectory_ratio=0.0)(plain_rows)
    with_scores = collator(tokenizer, seed=7, trajectory_ratio=0.0)(prepared[:8])
    for key in plain:
        assert torch.equal(plain[key], with_scores[key]), key
    assert not plain["is_trajectory"].any()
    assert torch.allclose(plain["loss_weights"], 1 / plain["t"])
    trims = collator(tokenizer, seed=7, trajectory_ratio=0.1)(prepared[:8])
    standard = ~trims["is_trajectory"]
    assert torch.equal(trims["input_ids"][standard], plain["input_ids"][standard])


def test_reproducible_and_trajectory_share(prepared, tokenizer):
    a, b = collator(tokenizer, seed=11), collator(tokenizer, seed=11)
    first = a(prepared[:8])
    assert torch.equal(first["input_ids"], b(prepared[:8])["input_ids"])  # same seed, epoch and rows: same masks
    assert not torch.equal(collator(tokenizer, seed=12)(prepared[:8])["input_ids"], first["input_ids"])
    assert not torch.equal(a(prepared[1:9])["input_ids"][:7], first["input_ids"][1:])  # other batch: fresh draw
    b.epoch = 1
    assert not torch.equal(b(prepared[:8])["input_ids"], first["input_ids"])  # next epoch: fresh draw
    flags = []
    for epoch in range(60):
        a.epoch = epoch
        flags.append(a(prepared[:32])["is_trajectory"])
    flags = torch.cat(flags)
    assert abs(flags.float().mean().item() - 0.1) < 5 * (0.09 / len(flags)) ** 0.5


def test_fixed_subset_needs_example_id(prepared, tokenizer):
    fixed = collator(tokenizer, trajectory_selection="fixed_subset", trajectory_ratio=0.5)
    with pytest.raises(SchemaError, match="example_id"):
        fixed([{k: v for k, v in row.items() if k != "example_id"} for row in prepared[:2]])
    flags = [fixed(prepared[:16])["is_trajectory"] for _ in range(3)]
    assert torch.equal(flags[0], flags[1]) and torch.equal(flags[1], flags[2])


def test_bad_rows_give_clear_errors(scored, tokenizer):
    trims = collator(tokenizer)
    with pytest.raises(SchemaError, match=r"row 0: not prepared for the student.*prepare_dataset"):
        trims(scored[:1])
    missing = {key: value for key, value in scored[0].items() if key != "teacher_nll"}
    with pytest.raises(SchemaError, match=r"row 1.*teacher_nll"):
        prepare_dataset(Dataset.from_list([scored[1], missing]), tokenizer)
    misaligned = {**scored[1], "teacher_nll": scored[1]["teacher_nll"][:-2]}
    with pytest.raises(SchemaError, match=r"row 0: per-token fields have different lengths"):
        prepare_dataset(Dataset.from_list([misaligned]), tokenizer)
    with pytest.raises(SchemaError, match=r"row 1: field 'completion' is empty"):
        prepare_dataset(Dataset.from_list([scored[2], {**scored[3], "completion": "  "}]), tokenizer)
    with pytest.raises(SchemaError, match="row 0: the prompt has .* tokens, leaving no room"):
        prepare_dataset(Dataset.from_list(scored[:1]), tokenizer, StudentFormat(max_length=4))
    prepared = {"input_ids": [1, 2, 3, 4], "prompt_length": 2, "bucket_ids": [0], "example_id": 41}
    with pytest.raises(SchemaError, match=r"row 41: 'bucket_ids' has 1 entries but there are 2 completion tokens"):
        trims([prepared])
    with pytest.raises(SchemaError, match="row 0: missing field 'bucket_ids'"):
        trims([{"input_ids": [1, 2, 3], "prompt_length": 1}])
    with pytest.raises(SchemaError, match="row 0: the prompt has no tokens"):
        collator(tokenizer, trajectory_ratio=0.0)([{"input_ids": [5, 6, 7], "prompt_length": 0}])
    out_of_range = {"input_ids": [1, 2, 3, 4], "prompt_length": 2, "bucket_ids": [0, 9]}
    with pytest.raises(SchemaError, match=r"row 0: 'bucket_ids' must lie in \[0, 8\)"):
        trims([out_of_range])
