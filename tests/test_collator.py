"""TrimsDataCollator: raw and prepared rows, truncation, padding, labels, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Dataset

from conftest import synthetic_scored_rows
from trims_hf import TrimsDataCollator, prepare_dataset
from trims_hf.schema import SchemaError


@pytest.fixture(scope="module")
def scored(gsm8k_rows, tokenizer):
    return synthetic_scored_rows(gsm8k_rows[:32], tokenizer)


def test_raw_rows_batch_layout(scored, tokenizer):
    collator = TrimsDataCollator(tokenizer, max_length=512)
    out = collator(scored[:4])
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


def test_prepared_rows_equal_raw_rows_for_same_tokenizer(scored, tokenizer):
    """With teacher tokenizer == student tokenizer, projection is the identity and both paths agree."""
    prepared = prepare_dataset(Dataset.from_list(scored), tokenizer, num_buckets=8)
    for row, raw in zip(prepared, scored):
        completion = row["bucket_ids"][: len(raw["teacher_bucket"])]
        assert completion == raw["teacher_bucket"]
        assert np.allclose(row["student_score"], raw["teacher_nll"], atol=1e-6)
        assert row["bucket_ids"][len(raw["teacher_bucket"]):] == [7]  # end of response: easiest bucket
    raw_batch = TrimsDataCollator(tokenizer, seed=3)(scored[:8])
    prepared_batch = TrimsDataCollator(tokenizer, seed=3)(list(prepared.select(range(8))))
    for key in raw_batch:
        assert torch.equal(raw_batch[key], prepared_batch[key]), key


def test_truncation_keeps_buckets_aligned(scored, tokenizer):
    prepared = prepare_dataset(Dataset.from_list(scored[:4]), tokenizer)
    row = prepared[0]
    max_length = row["prompt_length"] + 5
    collator = TrimsDataCollator(tokenizer, max_length=max_length, trajectory_ratio=1.0, p_context=0.0, p_future=1.0)
    buckets = row["bucket_ids"][:5]
    for draw in range(20):
        out = collator([row])
        assert out["input_ids"].shape[1] == max_length
        masked = (out["labels"][0] != -100)[row["prompt_length"]:]
        # k is unknown but the masked set must be exactly the tokens above some threshold bucket
        masked_buckets = {b for b, m in zip(buckets, masked.tolist()) if m}
        kept_buckets = {b for b, m in zip(buckets, masked.tolist()) if not m}
        assert not masked_buckets or not kept_buckets or min(masked_buckets) > max(kept_buckets)


def test_ratio_zero_is_plain_mdlm_and_needs_no_scores(gsm8k_rows, scored, tokenizer):
    plain = TrimsDataCollator(tokenizer, trajectory_ratio=0.0, seed=7)(gsm8k_rows[:8])
    with_scores = TrimsDataCollator(tokenizer, trajectory_ratio=0.0, seed=7)(scored[:8])
    for key in plain:
        assert torch.equal(plain[key], with_scores[key]), key
    assert not plain["is_trajectory"].any()
    assert torch.allclose(plain["loss_weights"], 1 / plain["t"])
    trims = TrimsDataCollator(tokenizer, trajectory_ratio=0.1, seed=7)(scored[:8])
    standard = ~trims["is_trajectory"]
    assert torch.equal(trims["input_ids"][standard], plain["input_ids"][standard])


def test_reproducible_and_trajectory_share(scored, tokenizer):
    a = TrimsDataCollator(tokenizer, seed=11)
    b = TrimsDataCollator(tokenizer, seed=11)
    first = a(scored[:8])
    assert torch.equal(first["input_ids"], b(scored[:8])["input_ids"])  # same seed, epoch and rows: same masks
    assert not torch.equal(TrimsDataCollator(tokenizer, seed=12)(scored[:8])["input_ids"], first["input_ids"])
    assert not torch.equal(a(scored[1:9])["input_ids"][:7], first["input_ids"][1:])  # other batch: fresh draw
    b.epoch = 1
    assert not torch.equal(b(scored[:8])["input_ids"], first["input_ids"])  # next epoch: fresh draw
    flags = []
    for epoch in range(60):
        a.epoch = epoch
        flags.append(a(scored[:32])["is_trajectory"])
    flags = torch.cat(flags)
    assert abs(flags.float().mean().item() - 0.1) < 5 * (0.09 / len(flags)) ** 0.5


def test_fixed_subset_needs_example_id(scored, tokenizer):
    collator = TrimsDataCollator(tokenizer, trajectory_selection="fixed_subset", trajectory_ratio=0.5)
    with pytest.raises(SchemaError, match="example_id"):
        collator(scored[:2])
    rows = [{**row, "example_id": i} for i, row in enumerate(scored[:16])]
    flags = [collator(rows)["is_trajectory"] for _ in range(3)]
    assert torch.equal(flags[0], flags[1]) and torch.equal(flags[1], flags[2])


def test_bad_rows_give_clear_errors(scored, tokenizer):
    collator = TrimsDataCollator(tokenizer)
    missing = {key: value for key, value in scored[0].items() if key != "teacher_bucket"}
    with pytest.raises(SchemaError, match=r"row 0.*teacher_bucket"):
        collator([missing])
    misaligned = {**scored[1], "teacher_bucket": scored[1]["teacher_bucket"][:-2]}
    with pytest.raises(SchemaError, match=r"row 0: per-token fields have different lengths"):
        collator([misaligned])
    with pytest.raises(SchemaError, match=r"row 1: field 'completion' is empty"):
        collator([scored[2], {**scored[3], "completion": "  "}])
    prepared = {"input_ids": [1, 2, 3, 4], "prompt_length": 2, "bucket_ids": [0], "example_id": 41}
    with pytest.raises(SchemaError, match=r"row 41: 'bucket_ids' has 1 entries but there are 2 completion tokens"):
        collator([prepared])
    with pytest.raises(SchemaError, match="row 0: missing field 'bucket_ids'"):
        collator([{"input_ids": [1, 2, 3], "prompt_length": 1}])
    with pytest.raises(SchemaError, match="row 0: the prompt has no tokens"):
        TrimsDataCollator(tokenizer, trajectory_ratio=0.0)([{"input_ids": [5, 6, 7], "prompt_length": 0}])
    with pytest.raises(SchemaError, match="leaving no room"):
        TrimsDataCollator(tokenizer, max_length=4)([scored[0]])
    out_of_range = {"input_ids": [1, 2, 3, 4], "prompt_length": 2, "bucket_ids": [0, 9]}
    with pytest.raises(SchemaError, match=r"row 0: 'bucket_ids' must lie in \[0, 8\)"):
        collator([out_of_range])
