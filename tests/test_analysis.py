"""Run analyses (decode order vs teacher NLL, bucket statistics, seed studies) against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers_teachers import make_teacher
from helpers_tokenizers import make_tokenizer

from trims_hf import EvalResult
from trims_hf.data.buckets import bucket_statistics
from trims_hf.generation.hooks import Trajectory
from trims_hf.studies.analysis import (
    TeacherNLL,
    format_study,
    hard_first_correlation,
    spearman_correlation,
    steps_into_block,
    study_rows,
    teacher_nll_scorer,
)

STOP = 99


def test_spearman_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for _ in range(5):
        x, y = rng.integers(0, 5, 30).astype(float), rng.normal(size=30)
        assert spearman_correlation(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def test_spearman_hand_cases():
    # One swapped pair among four: rho = 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 2 / 60.
    assert spearman_correlation(np.array([1.0, 2, 3, 4]), np.array([10.0, 30, 20, 40])) == pytest.approx(0.8)
    assert spearman_correlation(np.array([1.0, 2, 3]), np.array([3.0, 2, 1])) == pytest.approx(-1.0)
    assert math.isnan(spearman_correlation(np.array([1.0, 2, 3]), np.array([5.0, 5, 5])))


def test_spearman_is_nan_without_two_paired_numbers_and_refuses_unpaired_sides():
    stats = pytest.importorskip("scipy.stats")
    x, y = np.array([1.0, 2, np.nan, 4, 5]), np.array([5.0, 4, 3, 2, 1])
    assert math.isnan(spearman_correlation(x, y)) and math.isnan(stats.spearmanr(x, y).statistic)  # as scipy's default
    assert math.isnan(spearman_correlation(y, x))
    assert math.isnan(spearman_correlation(np.array([1.0]), np.array([2.0])))
    assert math.isnan(spearman_correlation(np.array([]), np.array([])))
    with pytest.raises(ValueError, match="3 and 2 values"):
        spearman_correlation(np.array([1.0, 2, 3]), np.array([1.0, 2]))


def test_steps_into_block_counts_from_each_blocks_first_commit():
    steps = np.array([3.0, 1, 2, 7, 5, 6, 9])
    assert steps_into_block(steps, 3).tolist() == [2, 0, 1, 2, 0, 1, 0]


def trajectory(commit_step: list[int], tokens: list[int]) -> Trajectory:
    n = len(commit_step)
    return Trajectory("s", torch.tensor(commit_step), torch.tensor(tokens), torch.full((n,), -1), (STOP,))


def test_hard_first_correlation_ranks_nll_against_lateness_in_block():
    stats = pytest.importorskip("scipy.stats")
    # Two blocks of three; the hardest token of each block is committed first.
    t = trajectory([2, 0, 1, 5, 3, 4], [10, 11, 12, 13, 14, 15])
    nll = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.8, 0.4])
    value = hard_first_correlation(t, lambda ids: nll[: len(ids)], block_length=3)
    assert value == pytest.approx(stats.spearmanr(nll.numpy(), [2, 0, 1, 2, 0, 1]).statistic)
    assert value < -0.9


def test_hard_first_correlation_is_nan_when_teacher_tokens_differ_or_answer_is_short():
    t = trajectory([2, 0, 1, 5, 3, 4], [10, 11, 12, 13, 14, 15])
    assert math.isnan(hard_first_correlation(t, lambda ids: torch.ones(len(ids) + 1), block_length=3))
    short = trajectory([1, 0, 2, 3], [10, 11, STOP, 12])  # the answer stops after two tokens
    seen = []
    assert math.isnan(hard_first_correlation(short, lambda ids: seen.append(ids.tolist()) or torch.rand(len(ids)), 3))
    assert seen == [[10, 11]]


def test_teacher_nll_scorer_matches_a_plain_forward():
    # Two tokenizers with different vocabularies: student ids reach the teacher through text.
    texts = ["Tom has 3 apples and buys 4 more. How many apples does he have?", "He has 7 apples."]
    tokenizer, student_tokenizer = make_tokenizer(texts, vocab_size=300), make_tokenizer(texts[1:], vocab_size=270)
    teacher = make_teacher(tokenizer)
    prompt, answer = "How many apples?", "He has 7 apples."
    student_ids = torch.tensor(student_tokenizer(answer, add_special_tokens=False)["input_ids"])
    scored = teacher_nll_scorer(teacher, tokenizer, student_tokenizer, prompt, max_length=256)(student_ids)

    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = teacher(torch.tensor([prompt_ids + answer_ids])).logits[0].double()
    log_probs = logits[len(prompt_ids) - 1 : -1].log_softmax(-1)
    expected = -log_probs[torch.arange(len(answer_ids)), torch.tensor(answer_ids)]
    assert scored.shape == expected.shape
    torch.testing.assert_close(scored.double(), expected, atol=1e-4, rtol=1e-4)
    empty = teacher_nll_scorer(teacher, tokenizer, student_tokenizer, prompt, 256)(torch.tensor([], dtype=torch.long))
    assert torch.isnan(empty).all()


def test_teacher_nll_scores_many_partial_responses_in_few_forwards_with_the_same_numbers():
    # A trace scores one partial response per decoding step; one batch-1 forward each was most of a traced evaluation.
    texts = ["Tom has 3 apples and buys 4 more. How many apples does he have?", "He has 7 apples, so 3 + 4 = 7."]
    tokenizer, student_tokenizer = make_tokenizer(texts, vocab_size=300), make_tokenizer(texts[1:], vocab_size=270)
    teacher = make_teacher(tokenizer)
    ids = torch.tensor(student_tokenizer(texts[1], add_special_tokens=False)["input_ids"])
    requests = [(prompt, ids[:n]) for prompt in ("How many apples?", "And pears?") for n in range(1, len(ids) + 1)]
    batched = TeacherNLL(teacher, tokenizer, student_tokenizer, 256)
    batched.prefetch(requests)
    assert 0 < batched.forwards < len(requests) // 4
    for prompt, partial in requests:
        one = teacher_nll_scorer(teacher, tokenizer, student_tokenizer, prompt, 256)(partial)
        torch.testing.assert_close(batched.scorer(prompt)(partial), one, atol=1e-5, rtol=1e-5)
    before = batched.forwards
    batched.scorer("How many apples?")(ids)  # scored already: no forward
    assert batched.forwards == before


def test_bucket_statistics_by_hand():
    # Row 1: two completion tokens and one end-of-response token; row 2: one completion token and two end tokens.
    stats = bucket_statistics([[1.0, 3.0], [2.0]], [[0, 1, 3], [1, 3, 3]], num_buckets=4)
    assert stats["per_bucket"] == [
        {"bucket": 0, "tokens": 1, "nll_share": pytest.approx(1 / 6), "mean_nll": 1.0},
        {"bucket": 1, "tokens": 2, "nll_share": pytest.approx(5 / 6), "mean_nll": 2.5},
        {"bucket": 2, "tokens": 0, "nll_share": 0.0, "mean_nll": None},  # no tokens: no mean
        {"bucket": 3, "tokens": 0, "nll_share": 0.0, "mean_nll": None},
    ]
    assert stats["end_of_response_tokens"] == 3 and stats["end_of_response_bucket"] == 3
    assert stats["completion_tokens"] == 3 and stats["total_teacher_nll"] == 6.0


def result(model: str, threshold: float, accuracy: float, tokens_per_step: float, strategy: str = "threshold") -> EvalResult:
    return EvalResult(model=model, task="arith", accuracy=accuracy, tokens_per_step=tokens_per_step,
                      tokens_per_forward_non_eos=tokens_per_step, tokens_per_second=1.0, nfe=10, generated_tokens=10,
                      non_eos_tokens=10, num_samples=1, decode_time_s=1.0, wall_time_s=1.0, early_stop=True,
                      prompt_format={}, decoding={"strategy": strategy, "threshold": threshold})


STUDY = [(None, result("base", 0.9, 0.1, 1.0)),
         (0, result("MDLM", 0.9, 0.5, 2.0)), (1, result("MDLM", 0.9, 0.4, 1.0)),
         (0, result("TRIMS", 0.9, 0.6, 2.0)), (1, result("TRIMS", 0.9, 0.7, 4.0)),
         (0, result("TRIMS", 0.5, 0.3, 8.0))]


def test_study_rows_mean_spread_and_per_seed_ratio():
    rows = {(r["model"], r["threshold"]): r for r in study_rows(STUDY)}
    assert set(rows) == {("base", 0.9), ("MDLM", 0.9), ("TRIMS", 0.9), ("TRIMS", 0.5)}
    trims = rows["TRIMS", 0.9]
    assert trims["seeds"] == [0, 1]
    assert trims["accuracy"] == pytest.approx({"mean": 0.65, "std": np.std([0.6, 0.7]), "min": 0.6, "max": 0.7})
    assert trims["tokens_per_step"] == pytest.approx({"mean": 3.0, "std": 1.0, "min": 2.0, "max": 4.0})
    assert trims["tokens_per_step_vs_mdlm"] == pytest.approx((2 / 2 + 4 / 1) / 2)  # per-seed ratios, then the mean
    assert trims["seeds_above_mdlm"] == [1, 2]  # seed 0 ties MDLM: not above
    assert rows["MDLM", 0.9]["seeds_above_mdlm"] is None  # the baseline is not compared with itself
    assert rows["base", 0.9]["seeds"] == [] and rows["base", 0.9]["tokens_per_step_vs_mdlm"] is None
    assert rows["TRIMS", 0.5]["tokens_per_step_vs_mdlm"] is None  # no MDLM at that threshold
    assert rows["TRIMS", 0.5]["accuracy"]["std"] == 0.0


def test_study_rows_rejects_other_strategies():
    with pytest.raises(ValueError, match="threshold"):
        study_rows([(0, result("MDLM", 0.9, 0.5, 2.0, strategy="entropy"))])


@pytest.mark.parametrize(("results", "message"), [
    ([*STUDY, (0, result("TRIMS", 0.9, 0.1, 9.0))], r"^TRIMS at threshold 0\.9, seed 0: two results; pass each run once\.$"),
    ([*STUDY, (None, result("TRIMS", 0.9, 0.1, 9.0))], r"^TRIMS at threshold 0\.9: runs with and without a seed"),
    ([(None, result("base", 0.9, 0.1, 1.0)), (0, result("base", 0.9, 0.1, 1.0))], r"^base at threshold 0\.9: runs with"),
    ([(0, result("MDLM", 0.9, 0.5, 0.0)), (0, result("TRIMS", 0.9, 0.6, 2.0))],
     r"^MDLM at threshold 0\.9, seed 0: tokens per step 0\.0 \(no step decoded\); no ratio to it\.$"),
])
def test_study_rows_refuse_what_would_silently_change_a_mean(results, message):
    """A run given twice would replace the other in the mean; seeded and seedless runs of a model mixed would count
    seeds wrong; a baseline that decoded no step has no ratio (the seed would drop out of "above in k of n")."""
    with pytest.raises(ValueError, match=message):
        study_rows(results)


def test_format_study_lines():
    lines = format_study(study_rows(STUDY)).splitlines()
    assert lines[0].startswith("| Model | tau | seeds | Acc (%) mean ± std (min-max) |")
    assert lines[1] == "|---|---|---|---|---|---|"
    assert "| base | 0.9 | 1 | 10.0 ± 0.0 (10-10) | 1.00 ± 0.00 (1.00-1.00) | - |" in lines
    assert "| TRIMS | 0.9 | 2 | 65.0 ± 5.0 (60-70) | 3.00 ± 1.00 (2.00-4.00) | 2.50x (above in 1 of 2) |" in lines
    assert "| MDLM | 0.9 | 2 | 45.0 ± 5.0 (40-50) | 1.50 ± 0.50 (1.00-2.00) | 1.00x |" in lines
