"""Buckets: equal mass, orderings, ties, and the teacher -> student projection."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import synthetic_scored_rows
from datasets import Dataset, Value
from helpers_tokenizers import make_tokenizer

from trims_hf import (
    BucketConfig,
    SchemaError,
    StudentFormat,
    bucket_rows,
    equal_mass_buckets,
    prepare_dataset,
    project_scores,
    threshold_buckets,
)


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
    with pytest.raises(ValueError, match=r"score 1 \(flattened over the data set\) is -3\.0; a teacher score .* >= 0"):
        equal_mass_buckets(np.array([1.0, -3.0, 2.0]), 2)


def test_projection_rules():
    # teacher tokens [0,3) [3,5) [5,9); student tokens start at 0, 2, 6
    scores = project_scores([0, 3, 5], [3, 5, 9], [3.0, 2.0, 4.0], [(0, 2), (2, 6), (6, 9)], 9)
    np.testing.assert_allclose(scores, [2.0, 1.0 + 2.0 + 1.0, 3.0])
    assert scores.sum() == pytest.approx(9.0)
    same = project_scores([0, 3], [3, 5], [0.25, 0.5], [(0, 3), (3, 5)], 5)
    np.testing.assert_array_equal(same, [0.25, 0.5])
    # a zero-width teacher span is a point mass at its start
    np.testing.assert_allclose(project_scores([0, 3], [3, 3], [1.0, 5.0], [(0, 1), (1, 3)], 3), [1 / 3, 2 / 3 + 5.0])


def test_projected_scores_are_never_negative_and_keep_the_total():
    """Teacher NLLs of exactly 0 beside larger ones (a float32 softmax that rounds to 1) project onto another
    tokenizer's tokens as scores >= 0 that bucketing takes, their sum the teacher's."""
    one = project_scores([0, 4, 5, 6], [4, 5, 6, 8], [0.0, 0.4, 1.8, 0.0], [(0, 2), (2, 3), (3, 6), (6, 8)], 8)
    assert (one >= 0).all() and one.sum() == pytest.approx(2.2)
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(300):
        n_chars = int(rng.integers(1, 60))
        cuts = np.unique(np.concatenate([[0, n_chars], rng.integers(0, n_chars, size=int(rng.integers(1, 12)))]))
        scores = np.where(rng.random(len(cuts) - 1) < 0.5, 0.0, rng.exponential(2.0, len(cuts) - 1))
        starts = np.unique(np.concatenate([[0], rng.integers(0, n_chars, size=int(rng.integers(1, 12)))]))
        spans = list(zip(starts.tolist(), [*starts[1:].tolist(), n_chars]))
        projected = project_scores(cuts[:-1].tolist(), cuts[1:].tolist(), scores.tolist(), spans, n_chars)
        assert (projected >= 0).all()
        assert projected.sum() == pytest.approx(scores.sum(), abs=1e-9)
        rows.append(projected.tolist())
    ids, _ = bucket_rows(rows, BucketConfig(num_buckets=4))
    assert [len(row) for row in ids] == [len(row) for row in rows]
    given = project_scores([0, 2], [2, 4], [-1.0, 3.0], [(0, 1), (1, 3), (3, 4)], 4)  # a negative score given stays
    np.testing.assert_allclose(given, [-0.5, 1.0, 1.5])  # for bucketing to refuse


def test_different_student_tokenizer_on_gsm8k(gsm8k_rows, tokenizer):
    """Teacher and student tokenizers differ: totals preserved per row, equal mass over the scored student tokens."""
    texts = [r["prompt"] + "\n" + r["completion"] for r in gsm8k_rows]
    student = make_tokenizer(texts, vocab_size=300)
    scored = synthetic_scored_rows(gsm8k_rows, tokenizer)
    prepared = prepare_dataset(Dataset.from_list(scored), student)
    lengths = []
    for raw, row in zip(scored, prepared):
        completion_ids = student(raw["completion"], add_special_tokens=False)["input_ids"]
        assert len(row["student_score"]) == len(completion_ids) != len(raw["teacher_nll"])
        assert np.nansum(row["student_score"]) == pytest.approx(sum(raw["teacher_nll"]), rel=1e-5)
        assert len(row["bucket_ids"]) == len(row["input_ids"]) - row["prompt_length"]
        lengths.append(len(completion_ids))
    flat = np.concatenate([row["bucket_ids"][:n] for row, n in zip(prepared, lengths)])
    scored = ~np.isnan(np.concatenate(prepared["student_score"]))
    counts = np.bincount(flat[scored], minlength=8)
    assert counts.max() - counts.min() <= 1


def scored_by(tokenizer, rows: list[dict], nll_of) -> list[dict]:
    """Rows scored as the scorer stores them (disjoint spans), with NLLs ``nll_of(positions)``."""
    from trims_hf.data.schema import disjoint_spans

    scored = []
    for row in rows:
        spans = disjoint_spans(tokenizer(row["completion"], add_special_tokens=False,
                                         return_offsets_mapping=True)["offset_mapping"])
        nll = np.asarray(nll_of(np.arange(len(spans))), dtype=np.float32)
        scored.append({**row, "teacher_token_start": [s for s, _ in spans], "teacher_token_end": [e for _, e in spans],
                       "teacher_nll": nll.tolist(), "teacher_entropy": (nll / 2).tolist()})
    return scored


def test_byte_split_pieces_are_unscored_and_join_their_character(gsm8k_rows, tokenizer):
    """'€' is three bytes; the student's first two pieces own no character and get no teacher score.
    They must not enter the quantiles as zeros, and take the bucket of the piece that holds the character."""
    rows = [{"prompt": r["prompt"], "completion": r["completion"].replace("$", "€")} for r in gsm8k_rows[:32]]
    student = make_tokenizer([r["prompt"] + "\n" + r["completion"] for r in gsm8k_rows], vocab_size=300)
    rng = np.random.default_rng(0)
    prepared = prepare_dataset(Dataset.from_list(scored_by(tokenizer, rows, lambda p: rng.exponential(size=p.size))), student)
    scores, ids, first_pieces = [], [], []
    for raw, row in zip(rows, prepared):
        starts = [s for s, _ in student(raw["completion"], add_special_tokens=False,
                                        return_offsets_mapping=True)["offset_mapping"]]
        split = np.array([a == b for a, b in zip(starts, starts[1:])] + [False])  # the next piece starts at the same character
        score, bucket = np.asarray(row["student_score"]), np.asarray(row["bucket_ids"][: len(starts)])
        np.testing.assert_array_equal(np.isnan(score), split)
        for i in np.flatnonzero(split):
            assert bucket[i] == bucket[i + 1]
        scores.append(score[~split])
        ids.append(bucket[~split])
        first_pieces.append(split.sum())
    assert sum(first_pieces) > 50  # the case really occurs
    flat = np.concatenate(scores)
    expected, _ = equal_mass_buckets(flat, 8)
    np.testing.assert_array_equal(np.concatenate(ids), expected)  # the quantiles are those of the scored tokens alone


def test_a_tail_the_teacher_did_not_score_is_unscored(gsm8k_rows, tokenizer):
    """a teacher truncated after half the completion scores no tail; the student's tail tokens
    stay out of the quantiles and go to the easiest bucket."""
    student = make_tokenizer([r["prompt"] + "\n" + r["completion"] for r in gsm8k_rows], vocab_size=300)
    scored = scored_by(tokenizer, gsm8k_rows[:20], lambda p: 1.0 + np.random.default_rng(len(p)).exponential(size=p.size))
    for row in scored:  # as `trims score --truncate` writes a row cut to its first half
        half = len(row["teacher_nll"]) // 2
        for name in ("teacher_token_start", "teacher_token_end", "teacher_nll", "teacher_entropy"):
            row[name] = row[name][:half]
    prepared = prepare_dataset(Dataset.from_list(scored), student)
    in_quantiles = []
    for raw, row in zip(scored, prepared):
        starts = np.array([s for s, _ in student(raw["completion"], add_special_tokens=False,
                                                 return_offsets_mapping=True)["offset_mapping"]])
        tail = starts >= raw["teacher_token_end"][-1]
        score, bucket = np.asarray(row["student_score"]), np.asarray(row["bucket_ids"][: len(starts)])
        assert tail.sum() > 5 and np.isnan(score[tail]).all() and (bucket[tail] == 7).all()
        in_quantiles.append(bucket[~np.isnan(score)])
    counts = np.bincount(np.concatenate(in_quantiles), minlength=8)
    assert counts.max() - counts.min() <= 1


@pytest.mark.parametrize("quantile_tokens", ["kept", "all"])
def test_quantiles_over_kept_or_all_student_tokens(gsm8k_rows, tokenizer, quantile_tokens):
    """with max_length cutting every completion, 'kept' cuts equal mass over the trained tokens;
    'all' over whole completions (harder tails then crowd the hard buckets out of the kept tokens)."""
    rows = scored_by(tokenizer, [{"prompt": "Q", "completion": r["completion"]} for r in gsm8k_rows[:24]],
                     lambda p: p / 10.0)  # later tokens are harder
    prepared = prepare_dataset(Dataset.from_list(rows), tokenizer, StudentFormat(max_length=64),
                               BucketConfig(num_buckets=4, quantile_tokens=quantile_tokens))
    kept = [len(row["student_score"]) for row in prepared]
    assert all(k < len(r["teacher_nll"]) for k, r in zip(kept, rows))  # every row is cut
    over = [r["teacher_nll"][:k] if quantile_tokens == "kept" else r["teacher_nll"] for r, k in zip(rows, kept)]
    expected, _ = equal_mass_buckets(np.concatenate(over), 4)
    expected = [part[:k] for part, k in zip(np.split(expected, np.cumsum([len(o) for o in over])[:-1]), kept)]
    for row, ids, k in zip(prepared, expected, kept):
        np.testing.assert_array_equal(row["bucket_ids"][:k], ids)
    counts = np.bincount(np.concatenate([row["bucket_ids"][:k] for row, k in zip(prepared, kept)]), minlength=4)
    if quantile_tokens == "kept":
        assert counts.max() - counts.min() <= 1
    else:
        assert counts[0] < counts[3] / 2


def test_tokens_outside_the_quantiles_follow_the_thresholds():
    from trims_hf.data.buckets import threshold_buckets

    scores = np.arange(10.0)
    ids, thresholds = equal_mass_buckets(scores, 5)  # thresholds 8, 6, 4, 2: the first score of buckets 1..4
    np.testing.assert_array_equal(threshold_buckets(scores, thresholds, "hard_to_easy"), ids)
    np.testing.assert_array_equal(threshold_buckets(np.array([100.0, 8.5, -3.0]), thresholds, "hard_to_easy"), [0, 0, 4])
    up, up_thresholds = equal_mass_buckets(scores, 5, "easy_to_hard")
    np.testing.assert_array_equal(threshold_buckets(scores, up_thresholds, "easy_to_hard"), up)


BUCKET_MISUSES = {
    "K as a bool": (lambda: equal_mass_buckets([1.0, 2.0, 3.0], True), r"num_buckets must be in \[1, \d+\], got True"),
    "K as a fraction": (lambda: equal_mass_buckets([1.0, 2.0, 3.0], 2.5), r"num_buckets must be in .* got 2\.5"),
    "K as a string": (lambda: equal_mass_buckets([1.0, 2.0, 3.0], "3"), r"num_buckets must be in .* got 3"),
    "an unknown ordering": (lambda: threshold_buckets([2.0], [3.0, 1.0], "bogus"),
                            r"ordering='bogus': thresholds cut hard_to_easy or easy_to_hard buckets"),
    "random has no thresholds": (lambda: threshold_buckets([2.0], [], "random"), r"ordering='random'"),
    "a NaN score": (lambda: threshold_buckets([2.0, float("nan")], [3.0, 1.0], "hard_to_easy"),
                    r"score 1 is NaN: an unscored token has no bucket of its own"),
    "thresholds out of order": (lambda: threshold_buckets([2.0], [1.0, 3.0], "hard_to_easy"),
                                r"thresholds \[1\.0, 3\.0\] are not in hard_to_easy order"),
    "kept of another length": (lambda: bucket_rows([[1.0, 2.0], [3.0]], BucketConfig(num_buckets=2), kept=[1]),
                               r"kept: one whole number >= 0 per row \(2 rows\), got \[1\]"),
    "a fractional kept": (lambda: bucket_rows([[1.0, 2.0], [3.0]], BucketConfig(num_buckets=2), kept=[1.5, 1]),
                          r"kept: .* got \[1\.5, 1\.0\]"),
    "a negative kept": (lambda: bucket_rows([[1.0, 2.0], [3.0]], BucketConfig(num_buckets=2), kept=[-1, 1]),
                        r"kept: .* got \[-1, 1\]"),
    "a span before the text": (lambda: project_scores([-3, 2], [2, 4], [1.0, 2.0], [(0, 1), (1, 4)], 4),
                               r"teacher span 0 = \[-3, 2\) does not lie in the 4 characters of the text"),
    "a span past the text": (lambda: project_scores([0, 2], [2, 9], [1.0, 2.0], [(0, 1), (1, 4)], 4),
                             r"teacher span 1 = \[2, 9\)"),
    "scores of another count": (lambda: project_scores([0, 2], [2, 4], [1.0], [(0, 1), (1, 4)], 4),
                                r"one per teacher token, got 2, 2 and 1"),
}


@pytest.mark.parametrize("case", BUCKET_MISUSES)
def test_bucket_functions_refuse_what_they_would_coerce(case):
    """Each of these returned plausible ids or scores before (a bool K of 1, an unknown ordering read as easy_to_hard,
    a NaN score as the hardest bucket, a negative span start wrapping to the text's end and losing its score)."""
    call, message = BUCKET_MISUSES[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_thresholds_place_scores_as_the_quantile_set_does_and_projection_keeps_the_mass():
    scores = np.array([5.0, 1.0, 3.0, 2.0, 4.0, 0.5])
    for ordering in ("hard_to_easy", "easy_to_hard"):
        ids, thresholds = equal_mass_buckets(scores, 3, ordering)
        assert threshold_buckets(scores, thresholds, ordering).tolist() == ids.tolist()
    projected = project_scores([0, 2], [2, 4], [1.0, 2.0], [(0, 1), (1, 4)], 4)
    assert projected.tolist() == [0.5, 2.5]


def test_a_data_set_keeps_its_own_example_ids_or_is_told_why_not(tokenizer):
    rows = [{"prompt": f"What is {i} + 1?", "completion": f"It is {i + 1}."} for i in range(4)]
    assert prepare_dataset(Dataset.from_list(rows), tokenizer)["example_id"] == [0, 1, 2, 3]
    own = [dict(row, example_id=id_) for row, id_ in zip(rows, [40, 7, -3, 12])]
    prepared = prepare_dataset(Dataset.from_list(own).shuffle(seed=1), tokenizer)
    by_prompt = {row["prompt"]: row["example_id"] for row in own}
    assert prepared["example_id"] == [by_prompt[prompt] for prompt in prepared["prompt"]]
    for ids, kind, message in [
            (["a", "b", "c", "d"], "string", r"row 0: column 'example_id' is 'a'; it is kept as the row's id"),
            ([1.0, 2.0, 3.0, 4.0], "float64", r"row 0: column 'example_id' is 1.0"),
            ([5, 6, 5, 7], "int64", r"rows 0 and 2: column 'example_id' is 5 in both"),
            ([1, 2, 2**63, 3], "uint64", r"row 2: column 'example_id' is 9223372036854775808; .* fits 64 bits")]:
        with pytest.raises(SchemaError, match=message):
            prepare_dataset(Dataset.from_list(rows).add_column("example_id", ids, feature=Value(kind)), tokenizer)
