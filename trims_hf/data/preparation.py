"""Scored rows -> student rows, once per student: token ids, prompt length and one bucket id per completion token.

Like TRL's SFTTrainer, data is prepared once before training (:class:`trims_hf.MDLMTrainer` calls
:func:`prepare_dataset` on rows that are not prepared yet); the collator then only pads and noises.
The teacher's per-token scores are projected onto the student's tokens (character-proportional,
:func:`trims_hf.data.buckets.project_scores`) and cut into equal-mass buckets over the student tokens that
survive truncation to ``max_length``, the tokens training actually sees (``quantile_tokens="all"``: over
whole completions). Student tokens no teacher score reaches (:func:`trims_hf.data.buckets.teacher_coverage`)
stay out of the quantiles; :func:`trims_hf.data.buckets.bucket_rows` says which bucket they get.

End-of-response tokens (appended after the completion) and EOS padding are not scored: they are kept out of
the quantiles and go to :attr:`BucketConfig.end_bucket`, the last bucket under every ordering.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from datasets import Dataset

from ..prompts import check_system_prompt, end_of_response_ids, prompt_token_ids
from ..settings import BucketConfig, StudentFormat
from . import schema
from .buckets import bucket_rows, project_scores, teacher_coverage

logger = logging.getLogger(__name__)

KEPT, END_TOKENS = "_kept_tokens", "_end_tokens"  # working columns of prepare_dataset


@dataclass
class TokenizedExample:
    """A prompt/completion pair in student tokens, cut to ``max_length``."""

    input_ids: list[int]
    prompt_length: int
    completion_spans: list[tuple[int, int]] = field(repr=False)  # character span of every completion token
    num_completion_tokens: int  # completion tokens kept within max_length
    num_end_tokens: int  # end-of-response tokens kept within max_length


def tokenize_example(tokenizer: Any, prompt: Any, completion: str, fmt: StudentFormat | None = None,
                     index: int | None = None) -> TokenizedExample:
    """Tokenise the prompt (:func:`trims_hf.prompts.prompt_token_ids`) and the completion separately, keeping the
    completion's character offsets, append the end-of-response tokens and cut to ``fmt.max_length``."""
    fmt = fmt or StudentFormat()
    prompt_ids = prompt_token_ids(tokenizer, prompt, fmt)
    where = f"row {index}" if index is not None else "row"
    if not prompt_ids:
        # Shifted students (Dream) predict token i from position i - 1: position 0 must be a visible prompt token.
        raise schema.SchemaError(f"{where}: the prompt has no tokens; a row needs at least one (e.g. BOS).")
    if len(prompt_ids) >= fmt.max_length:
        raise schema.SchemaError(f"{where}: the prompt has {len(prompt_ids)} tokens, leaving no room for the "
                                 f"completion within max_length={fmt.max_length}.")
    encoded = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)
    if (mask := getattr(tokenizer, "mask_token_id", None)) is not None and mask in encoded["input_ids"]:
        raise schema.SchemaError(f"{where}: the completion holds the mask token's text {tokenizer.mask_token!r}, which "
                                 "the tokenizer reads as the mask: a target of the mask id would teach the student to "
                                 "leave positions masked; remove it from the text.")
    room = fmt.max_length - len(prompt_ids)
    completion_ids = list(encoded["input_ids"])[:room]
    end_ids = end_of_response_ids(tokenizer, fmt.end_of_response)[: room - len(completion_ids)]
    return TokenizedExample(
        input_ids=prompt_ids + completion_ids + end_ids,
        prompt_length=len(prompt_ids),
        completion_spans=[tuple(span) for span in encoded["offset_mapping"]],
        num_completion_tokens=len(completion_ids),
        num_end_tokens=len(end_ids),
    )


def is_prepared(dataset: Dataset) -> bool:
    """Whether ``dataset`` already holds student rows (``input_ids`` and ``prompt_length``)."""
    return {schema.INPUT_IDS, schema.PROMPT_LENGTH} <= set(getattr(dataset, "column_names", None) or ())


def longest_row(dataset: Dataset) -> int:
    """The most ``input_ids`` any prepared row holds (read from the Arrow column's list lengths, not the ids)."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(dataset.data.column(schema.INPUT_IDS))
    return int(pc.max(lengths).as_py() or 0)


MIN_IDS_PER_BUCKET = 16
"""A prepared set's K is read from its bucket ids only when it holds at least this many per bucket: fewer scored
tokens than K, or a random ordering over a handful of tokens, may leave its last bucket empty."""


def bucket_count(dataset: Any, expected: int) -> int | None:
    """How many buckets prepared rows were cut into: their largest bucket id + 1. A prepared set holds its last bucket
    (the end of every response kept whole, and a 1/K share of its scored tokens: the quantiles cover every id), once
    it holds ``MIN_IDS_PER_BUCKET`` ids a bucket of ``expected`` K (the run's) or of its own. None for fewer, for rows
    without bucket ids, or for rows not held in an Arrow table (a data set given as a list or a stream is not
    scanned)."""
    table = getattr(dataset, "data", None)
    if schema.BUCKET_IDS not in (getattr(dataset, "column_names", None) or ()) or not hasattr(table, "column"):
        return None
    import pyarrow.compute as pc

    ids = pc.list_flatten(table.column(schema.BUCKET_IDS))
    top = pc.max(ids).as_py()
    return None if top is None or len(ids) < MIN_IDS_PER_BUCKET * max(expected, top + 1) else int(top) + 1


def prepare_dataset(
    dataset: Dataset,
    tokenizer: Any,
    fmt: StudentFormat | None = None,
    buckets: BucketConfig | None = None,
    *,
    num_proc: int | None = None,
) -> Dataset:
    """Tokenise a scored data set for one student and cut equal-mass buckets over its trained completion tokens.

    Adds ``input_ids``, ``prompt_length`` and ``example_id`` (the row's index, or the data set's own ``example_id``
    column, kept when it holds unique whole numbers, so a subset or shuffle of the rows keeps each row's masks and
    place in the fixed trajectory subset); when the rows hold teacher scores (spans and the
    ``buckets.metric`` column), also ``bucket_ids`` and ``student_score`` (NaN for tokens no teacher score
    reaches). Rows without scores (plain prompt/completion) serve the MDLM baseline. ``fmt`` and ``buckets``
    default to the paper's settings.
    """
    fmt, buckets = fmt or StudentFormat(), buckets or BucketConfig()
    check_system_prompt(tokenizer, fmt)
    scored = schema.has_teacher_scores(dataset.column_names, buckets.metric)
    schema.check_metric_column(dataset.column_names, buckets.metric)
    score_column = schema.METRIC_COLUMNS[buckets.metric] if scored else None
    if schema.EXAMPLE_ID in dataset.column_names:
        schema.check_example_ids(dataset[schema.EXAMPLE_ID])

    def tokenize(row: dict[str, Any], index: int) -> dict[str, Any]:
        prompt, completion = schema.split_prompt_completion(row, index)
        example = tokenize_example(tokenizer, prompt, completion, fmt, index)
        prepared = {schema.INPUT_IDS: example.input_ids, schema.PROMPT_LENGTH: example.prompt_length,
                    schema.EXAMPLE_ID: row.get(schema.EXAMPLE_ID, index)}
        if score_column is not None:
            schema.validate_teacher_scores(row, completion, index,
                                           required=(schema.TEACHER_START, schema.TEACHER_END, score_column))
            spans = (row[schema.TEACHER_START], row[schema.TEACHER_END])
            scores = project_scores(*spans, row[score_column], example.completion_spans, len(completion))
            covered = teacher_coverage(*spans, example.completion_spans, len(completion))
            prepared[schema.STUDENT_SCORE] = np.where(covered, scores, np.nan).astype(np.float32)  # every completion token
            prepared[KEPT] = example.num_completion_tokens
            prepared[END_TOKENS] = example.num_end_tokens
        return prepared

    tokenized = dataset.map(tokenize, with_indices=True, num_proc=num_proc, desc="Tokenising for the student")
    if not scored:
        return tokenized
    scores, kept = tokenized[schema.STUDENT_SCORE], tokenized[KEPT]
    per_row, thresholds = bucket_rows(scores, buckets, kept)
    logger.info("Student-token bucket thresholds (%s, %s, over %s tokens): %s", buckets.metric, buckets.bucket_ordering,
                buckets.quantile_tokens, thresholds.tolist())
    column = [np.concatenate([ids[:n], np.full(n_end, buckets.end_bucket, dtype=np.int8)]).tolist()
              for ids, n, n_end in zip(per_row, kept, tokenized[END_TOKENS])]
    kept_scores = [np.asarray(s[:n], dtype=np.float32) for s, n in zip(scores, kept)]
    tokenized = tokenized.remove_columns([schema.STUDENT_SCORE, KEPT, END_TOKENS])
    return tokenized.add_column(schema.STUDENT_SCORE, kept_scores).add_column(schema.BUCKET_IDS, column)
