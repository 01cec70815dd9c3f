"""Difficulty buckets: equal-mass quantile buckets, orderings, and teacher -> student projection.

Paper §3.2: the scores of all completion tokens of the training set are cut into K equal-mass
buckets; harder tokens (higher NLL) get lower ids and are revealed first. The ordering is a property
of the bucket ids only, so the masker never needs to know it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

import numpy as np

from .settings import MAX_BUCKETS, BucketConfig, Ordering

ORDERINGS: tuple[str, ...] = get_args(Ordering)


def equal_mass_buckets(
    scores: np.ndarray, num_buckets: int, ordering: Ordering = "hard_to_easy", seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Assign each score a bucket id in ``[0, num_buckets)``; return ``(bucket_ids, thresholds)``.

    Buckets are cut by rank, so every bucket holds ``N / K`` tokens within one token even when
    many scores tie; ties are broken by position in ``scores`` (stable sort), so the result is
    deterministic. ``thresholds[k - 1]`` is the first (boundary) score of bucket ``k`` in decode
    order; for ``random`` (a seeded uniform draw per token) thresholds are empty.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if not 1 <= num_buckets <= MAX_BUCKETS:
        raise ValueError(f"num_buckets must be in [1, {MAX_BUCKETS}], got {num_buckets}.")
    if ordering not in ORDERINGS:
        raise ValueError(f"Unknown bucket ordering {ordering!r}; choose one of {ORDERINGS}.")
    if scores.size == 0:
        raise ValueError("Cannot build buckets: the data set has no completion tokens.")
    if not np.isfinite(scores).all():
        bad = int(np.flatnonzero(~np.isfinite(scores))[0])
        raise ValueError(f"Cannot build buckets: score {bad} (flattened over the data set) is {scores[bad]}.")
    if ordering == "random":
        rng = np.random.default_rng(seed)
        return rng.integers(0, num_buckets, size=scores.size).astype(np.int8), np.empty(0)
    keys = -scores if ordering == "hard_to_easy" else scores
    order = np.argsort(keys, kind="stable")
    ranks = np.empty(scores.size, dtype=np.int64)
    ranks[order] = np.arange(scores.size)
    bucket_ids = (ranks * num_buckets // scores.size).astype(np.int8)
    boundaries = -(-np.arange(1, num_buckets) * scores.size // num_buckets)  # ceil(k * N / K)
    thresholds = scores[order[np.minimum(boundaries, scores.size - 1)]]
    return bucket_ids, thresholds


def bucket_rows(per_row_scores: Sequence[Sequence[float]], config: BucketConfig) -> tuple[list[np.ndarray], np.ndarray]:
    """Cut the scores of all rows together into equal-mass buckets; return per-row bucket ids and the thresholds.

    Equal mass holds over every token of the data set (paper §3.2), not within each row.
    """
    lengths = [len(scores) for scores in per_row_scores]
    flat = np.concatenate([np.asarray(s, dtype=np.float64) for s in per_row_scores]) if lengths else np.zeros(0)
    ids, thresholds = equal_mass_buckets(flat, config.num_buckets, config.bucket_ordering, config.bucket_seed)
    return np.split(ids, np.cumsum(lengths)[:-1]), thresholds


def _same_spans(teacher_starts: Sequence[int], teacher_ends: Sequence[int], student_spans: Sequence[tuple[int, int]]) -> bool:
    return len(student_spans) == len(teacher_starts) and all(
        (s, e) == (ts, te) for (s, e), ts, te in zip(student_spans, teacher_starts, teacher_ends)
    )


def _starts(spans: Sequence[tuple[int, int]]) -> np.ndarray:
    return np.array([start for start, _ in spans], dtype=np.int64).reshape(-1)


def _contiguous_ends(starts: np.ndarray, n_chars: int) -> np.ndarray:
    """Each token owns the characters from its start to the next token's start (the last: to the end)."""
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1:] = n_chars
    return np.maximum(ends, starts)


def project_scores(
    teacher_starts: Sequence[int],
    teacher_ends: Sequence[int],
    teacher_scores: Sequence[float],
    student_spans: Sequence[tuple[int, int]],
    n_chars: int,
) -> np.ndarray:
    """Move per-teacher-token scores onto student tokens through character spans.

    Rule: a teacher token's score is spread evenly over the characters of its span (a zero-width span
    is a point mass at its start); each student token owns the characters from its start offset to the
    next student token's start (the first from 0, the last to the end of the text) and receives the sum
    over its characters. The total score of the completion is preserved exactly. When the student's
    spans are the teacher's (same tokenizer) the scores are copied unchanged.
    """
    if _same_spans(teacher_starts, teacher_ends, student_spans):
        return np.asarray(teacher_scores, dtype=np.float64)
    starts = np.asarray(teacher_starts, dtype=np.int64)
    ends = np.asarray(teacher_ends, dtype=np.int64)
    values = np.asarray(teacher_scores, dtype=np.float64)
    density = np.zeros(n_chars + 1, dtype=np.float64)
    widths = ends - starts
    wide = widths > 0
    # Spread wide spans with a difference array: +v/w at start, -v/w at end, then cumsum.
    np.add.at(density, starts[wide], values[wide] / widths[wide])
    np.add.at(density, ends[wide], -values[wide] / widths[wide])
    per_char = np.cumsum(density)[:n_chars]
    point = np.zeros(n_chars + 1, dtype=np.float64)
    np.add.at(point, np.minimum(starts[~wide], max(n_chars - 1, 0)), values[~wide])
    per_char = per_char + point[:n_chars] if n_chars else point[:1]
    cumulative = np.concatenate([[0.0], np.cumsum(per_char)])
    s_starts = _starts(student_spans).clip(0, n_chars)
    if s_starts.size == 0:
        return np.zeros(0)
    s_starts[0] = 0
    s_ends = _contiguous_ends(s_starts, len(cumulative) - 1)
    return cumulative[s_ends] - cumulative[s_starts]
