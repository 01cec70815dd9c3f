"""Buckets: equal mass, orderings, ties, and the teacher -> student projection."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import Dataset

from conftest import synthetic_scored_rows
from helpers_tokenizers import make_tokenizer
from trims_hf import equal_mass_buckets, prepare_dataset, project_scores


def test_equal_mass_and_orderings():
    scores = np.random.default_rng(0).exponential(size=1001)
    hard, thresholds = equal_mass_buckets(scores, 8, "hard_to_easy")
    counts = np.bincount(hard, minlength=8)
    assert counts.max() - counts.min() <= 1
    # harder (higher NLL) -> lower id: bucket means decrease
    means = [scores[hard == k].mean() for k in range(8)]
    assert all(a > b for a, b in zip(means, means[1:]))
    assert np.all(np.diff(thresholds) < 0) and len(thresholds) == 7
    easy, _ = equal_mass_buckets(scores, 8, "easy_to_hard")
    assert np.corrcoef(easy, hard)[0, 1] < -0.95
    random_a, none = equal_mass_buckets(scores, 8, "random", seed=1)
    random_b, _ = equal_mass_buckets(scores, 8, "random", seed=1)
    assert none.size == 0 and np.array_equal(random_a, random_b)
    assert abs(np.corrcoef(random_a, hard)[0, 1]) < 0.15


def test_ties_are_deterministic_and_balanced():
    scores = np.zeros(80)
    scores[:8] = 5.0
    ids, _ = equal_mass_buckets(scores, 8)
    assert np.array_equal(ids, equal_mass_buckets(scores.copy(), 8)[0])
    assert np.all(np.bincount(ids) == 10)
    assert np.all(ids[:8] == 0)  # the hard tokens come first


def test_bad_scores_rejected():
    with pytest.raises(ValueError, match="no completion tokens"):
        equal_mass_buckets(np.zeros(0), 8)
    with pytest.raises(ValueError, match="score 2"):
        equal_mass_buckets(np.array([1.0, 2.0, np.nan]), 2)


def test_projection_rules():
    # teacher tokens [0,3) [3,5) [5,9); student tokens start at 0, 2, 6
    scores = project_scores([0, 3, 5], [3, 5, 9], [3.0, 2.0, 4.0], [(0, 2), (2, 6), (6, 9)], 9)
    np.testing.assert_allclose(scores, [2.0, 1.0 + 2.0 + 1.0, 3.0])
    assert scores.sum() == pytest.approx(9.0)
    same = project_scores([0, 3], [3, 5], [0.25, 0.5], [(0, 3), (3, 5)], 5)
    np.testing.assert_array_equal(same, [0.25, 0.5])
    # a zero-width teacher span is a point mass at its start
    np.testing.assert_allclose(project_scores([0, 3], [3, 3], [1.0, 5.0], [(0, 1), (1, 3)], 3), [1 / 3, 2 / 3 + 5.0])


def test_different_student_tokenizer_on_gsm8k(gsm8k_rows, tokenizer):
    """Teacher and student tokenizers differ: totals preserved per row, equal mass over student tokens."""
    texts = [r["prompt"] + "\n" + r["completion"] for r in gsm8k_rows]
    student = make_tokenizer(texts, vocab_size=300)
    scored = synthetic_scored_rows(gsm8k_rows, tokenizer)
    prepared = prepare_dataset(Dataset.from_list(scored), student)
    lengths = []
    for raw, row in zip(scored, prepared):
        completion_ids = student(raw["completion"], add_special_tokens=False)["input_ids"]
        assert len(row["student_score"]) == len(completion_ids) != len(raw["teacher_nll"])
        assert sum(row["student_score"]) == pytest.approx(sum(raw["teacher_nll"]), rel=1e-5)
        assert len(row["bucket_ids"]) == len(row["input_ids"]) - row["prompt_length"]
        lengths.append(len(completion_ids))
    flat = np.concatenate([row["bucket_ids"][:n] for row, n in zip(prepared, lengths)])
    counts = np.bincount(flat, minlength=8)
    assert counts.max() - counts.min() <= 1
