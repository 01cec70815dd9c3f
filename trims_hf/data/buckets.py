"""Difficulty buckets: equal-mass quantile buckets, orderings, and teacher -> student projection.

Paper §3.2: the scores of all completion tokens of the training set are cut into K equal-mass
buckets; harder tokens (higher NLL) get lower ids and are revealed first. The ordering is a property
of the bucket ids only, so the masker never needs to know it.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Any, get_args

import numpy as np

from ..settings import MAX_BUCKETS, BucketConfig, Ordering
from .schema import disjoint_spans

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
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, Integral) or not 1 <= num_buckets <= MAX_BUCKETS:
        raise ValueError(f"num_buckets must be in [1, {MAX_BUCKETS}], got {num_buckets}.")
    if ordering not in ORDERINGS:
        raise ValueError(f"Unknown bucket ordering {ordering!r}; choose one of {ORDERINGS}.")
    if scores.size == 0:
        raise ValueError("Cannot build buckets: the data set has no completion tokens.")
    if not np.isfinite(scores).all():
        bad = int(np.flatnonzero(~np.isfinite(scores))[0])
        raise ValueError(f"Cannot build buckets: score {bad} (flattened over the data set) is {scores[bad]}.")
    if (scores < 0).any():  # NLL and entropy never are: a negative score is a mistake upstream, not a difficulty
        bad = int(np.flatnonzero(scores < 0)[0])
        raise ValueError(f"Cannot build buckets: score {bad} (flattened over the data set) is {scores[bad]}; a teacher "
                         "score (NLL or entropy) is >= 0.")
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


def threshold_buckets(scores: np.ndarray, thresholds: np.ndarray, ordering: Ordering) -> np.ndarray:
    """Bucket ids of scores outside the quantile set, by the thresholds :func:`equal_mass_buckets` returned.

    A score equal to a threshold joins the bucket that threshold starts, as it would in the quantile set.
    """
    scores, thresholds = np.asarray(scores, dtype=np.float64), np.asarray(thresholds, dtype=np.float64)
    if ordering not in ORDERINGS or ordering == "random":
        raise ValueError(f"ordering={ordering!r}: thresholds cut {' or '.join(o for o in ORDERINGS if o != 'random')} "
                         "buckets.")
    if np.isnan(scores).any():
        raise ValueError(f"score {int(np.flatnonzero(np.isnan(scores))[0])} is NaN: an unscored token has no bucket "
                         "of its own (bucket_rows gives it its neighbour's).")
    steps = np.diff(thresholds)
    if (steps > 0).any() if ordering == "hard_to_easy" else (steps < 0).any():
        raise ValueError(f"thresholds {thresholds.tolist()} are not in {ordering} order (as equal_mass_buckets returns "
                         "them).")
    if ordering == "hard_to_easy":  # thresholds descend: bucket = how many boundaries lie at or above the score
        ids = (thresholds[None, :] >= scores[:, None]).sum(-1)
    else:
        ids = (thresholds[None, :] <= scores[:, None]).sum(-1)
    return ids.astype(np.int8)


def _fill_unscored(ids: np.ndarray, end_bucket: int) -> np.ndarray:
    """Unscored tokens (-1) take the bucket of the next scored token of the row, or ``end_bucket`` when none follows."""
    n = ids.size
    following = np.where(ids >= 0, np.arange(n), n)
    following = np.minimum.accumulate(following[::-1])[::-1]
    return np.append(ids, np.int8(end_bucket))[following].astype(np.int8)


def bucket_rows(
    per_row_scores: Sequence[Sequence[float]], config: BucketConfig, kept: Sequence[int] | None = None
) -> tuple[list[np.ndarray], np.ndarray]:
    """Cut the scores of all rows together into equal-mass buckets; return per-row bucket ids and the thresholds.

    Equal mass holds over every token of the data set (paper §3.2), not within each row. ``kept`` is, per row,
    how many leading tokens survive truncation to the training length (default: all); with
    ``config.quantile_tokens == "kept"`` the quantiles are cut over those tokens only, since the others are
    never trained, and the others get their bucket from the thresholds. A NaN score marks a token without a
    teacher score (e.g. the first byte of a character a byte-level tokenizer split, or a tail the teacher did
    not score): it never enters the quantiles and takes the bucket of the next scored token of its row (the rest
    of its character), or ``config.end_bucket`` when none follows. Every token gets an id.
    """
    lengths = [len(scores) for scores in per_row_scores]
    if kept is not None:
        values = np.asarray(kept)
        if values.shape != (len(lengths),) or not (values.dtype.kind in "iu" or (
                values.dtype.kind == "f" and bool((values == np.floor(values)).all()))) or (values.size and values.min() < 0):
            raise ValueError(f"kept: one whole number >= 0 per row ({len(lengths)} rows), got "
                             f"{values.tolist()[:8] if values.ndim else kept!r}.")
    flat = np.concatenate([np.asarray(s, dtype=np.float64) for s in per_row_scores]) if lengths else np.zeros(0)
    scored = ~np.isnan(flat)
    in_quantiles = scored.copy()
    if kept is not None and config.quantile_tokens == "kept":
        position = np.concatenate([np.arange(n) for n in lengths]) if lengths else np.zeros(0, dtype=np.int64)
        in_quantiles &= position < np.repeat(np.asarray(kept, dtype=np.int64), lengths)
    ids = np.full(flat.size, -1, dtype=np.int8)
    if config.bucket_ordering == "random":  # no quantiles: one seeded draw per scored token, kept or not
        ids[scored], thresholds = equal_mass_buckets(flat[scored], config.num_buckets, "random", config.bucket_seed)
    else:
        ids[in_quantiles], thresholds = equal_mass_buckets(flat[in_quantiles], config.num_buckets, config.bucket_ordering)
        rest = scored & ~in_quantiles
        ids[rest] = threshold_buckets(flat[rest], thresholds, config.bucket_ordering)
    per_row = np.split(ids, np.cumsum(lengths)[:-1]) if lengths else []
    return [_fill_unscored(row, config.end_bucket) for row in per_row], thresholds


def _same_spans(teacher_starts: Sequence[int], teacher_ends: Sequence[int], student_spans: Sequence[tuple[int, int]]) -> bool:
    """The student's tokens are the teacher's: its spans equal the teacher's raw, or as the scorer stores them
    (:func:`~trims_hf.data.schema.disjoint_spans`, which moves a split character's later pieces to zero width)."""
    teacher = list(zip(teacher_starts, teacher_ends))
    return len(student_spans) == len(teacher) and (
        [tuple(span) for span in student_spans] == teacher or list(disjoint_spans(student_spans)) == teacher)


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
    if not len(teacher_starts) == len(teacher_ends) == len(teacher_scores):
        raise ValueError(f"teacher_starts, teacher_ends and teacher_scores: one per teacher token, got "
                         f"{len(teacher_starts)}, {len(teacher_ends)} and {len(teacher_scores)}.")
    if _same_spans(teacher_starts, teacher_ends, student_spans):
        return np.asarray(teacher_scores, dtype=np.float64)
    starts = np.asarray(teacher_starts, dtype=np.int64)
    ends = np.asarray(teacher_ends, dtype=np.int64)
    if starts.size and ((starts < 0).any() or (ends < starts).any() or (ends > n_chars).any()):
        bad = int(np.flatnonzero((starts < 0) | (ends < starts) | (ends > n_chars))[0])
        raise ValueError(f"teacher span {bad} = [{starts[bad]}, {ends[bad]}) does not lie in the {n_chars} characters "
                         "of the text.")
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
    owned = _owned_sums(per_char, student_spans, n_chars)
    # Differences of running sums leave -1e-16 where a token's characters carry a score of 0 (a teacher NLL of exactly
    # 0 beside larger ones): such rounding is 0; a negative score given (bucketing refuses it) stays as it came.
    rounding = 16 * np.finfo(np.float64).eps * float(np.abs(values).sum())
    return np.where((owned < 0) & (owned >= -rounding), 0.0, owned)


def _owned_sums(per_char: np.ndarray, student_spans: Sequence[tuple[int, int]], n_chars: int) -> np.ndarray:
    """Per student token, the sum of ``per_char`` over the characters it owns (from its start to the next
    token's start; the first from 0, the last to the end of the text)."""
    cumulative = np.concatenate([np.zeros(1, dtype=per_char.dtype), np.cumsum(per_char)])
    s_starts = _starts(student_spans).clip(0, n_chars)
    if s_starts.size == 0:
        return np.zeros(0, dtype=per_char.dtype)
    s_starts[0] = 0
    s_ends = _contiguous_ends(s_starts, len(cumulative) - 1)
    return cumulative[s_ends] - cumulative[s_starts]


def teacher_coverage(
    teacher_starts: Sequence[int], teacher_ends: Sequence[int], student_spans: Sequence[tuple[int, int]], n_chars: int
) -> np.ndarray:
    """Per student token, whether any teacher score reaches it under :func:`project_scores`'s rule.

    A student token gets nothing when the characters it owns are none (the first pieces of a character a
    byte-level tokenizer split: the last piece owns the character) or lie outside every teacher span (a tail
    the teacher did not score). Counted in integers, so no rounding can fake a score.
    """
    if _same_spans(teacher_starts, teacher_ends, student_spans):
        return np.ones(len(student_spans), dtype=bool)
    starts = np.asarray(teacher_starts, dtype=np.int64).clip(0, n_chars)
    ends = np.asarray(teacher_ends, dtype=np.int64).clip(0, n_chars)
    wide = ends > starts
    covering = np.zeros(n_chars + 1, dtype=np.int64)
    np.add.at(covering, starts[wide], 1)
    np.add.at(covering, ends[wide], -1)
    covering = np.cumsum(covering)[:n_chars]
    if n_chars:
        np.add.at(covering, np.minimum(starts[~wide], n_chars - 1), 1)
    return _owned_sums((covering > 0).astype(np.int64), student_spans, n_chars) > 0


def bucket_statistics(student_scores: Sequence[Sequence[float]], bucket_ids: Sequence[Sequence[int]],
                      num_buckets: int) -> dict[str, Any]:
    """Per hard-to-easy bucket: tokens, share of the total teacher NLL, mean NLL (None for a bucket without tokens,
    as with K above the number of tokens); and the end-of-response
    tokens, which a prepared row's ``bucket_ids`` carry past its ``student_score`` (they are kept out of the
    quantiles and go to the easiest bucket). Tokens without a teacher score (NaN) are counted apart, in
    ``unscored_tokens``, and left out of the per-bucket figures.

    Shows whether the buckets split the difficulty as intended: on real data the hardest bucket holds a
    large share of the NLL in few tokens.
    """
    scores = np.concatenate([np.asarray(s, dtype=np.float64) for s in student_scores])
    flat = np.concatenate([np.asarray(b[: len(s)]) for b, s in zip(bucket_ids, student_scores)])
    scored = ~np.isnan(scores)
    scores, flat, unscored = scores[scored], flat[scored], int((~scored).sum())
    total = scores.sum()
    rows = [{"bucket": k, "tokens": int((flat == k).sum()), "nll_share": float(scores[flat == k].sum() / total),
             "mean_nll": float(scores[flat == k].mean()) if (flat == k).any() else None} for k in range(num_buckets)]
    end_tokens = sum(len(b) - len(s) for b, s in zip(bucket_ids, student_scores))
    return {"per_bucket": rows, "end_of_response_tokens": end_tokens,
            "end_of_response_bucket": BucketConfig(num_buckets=num_buckets).end_bucket,
            "completion_tokens": int(flat.size) + unscored, "unscored_tokens": unscored, "total_teacher_nll": float(total)}
