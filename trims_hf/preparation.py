"""Turn scored rows into student tokens with one bucket id per completion token.

Two paths share the same tokenisation:
* :func:`prepare_dataset` (recommended) projects the teacher's per-token scores onto the student's
  tokens (character-proportional, :func:`trims_hf.buckets.project_scores`) and cuts equal-mass
  buckets over all student completion tokens of the data set, as the paper does for its own tokens.
* :func:`tokenize_scored_row` (used by the collator on raw scored rows, where no data-set-wide pass
  is possible) projects the teacher's bucket ids instead (majority of characters).

End-of-response tokens (appended after the completion) and EOS padding are kept out of the
quantiles and go to the easiest bucket: they are trivially predictable and, in LLaDA's convention,
are revealed last.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from datasets import Dataset

from . import schema
from .buckets import Ordering, easiest_bucket, equal_mass_buckets, project_buckets, project_scores

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StudentFormat:
    """How a prompt and a completion become student token ids."""

    use_chat_template: bool = True
    """Render the prompt with the tokenizer's chat template (user turn + generation prompt) when it has one."""
    system_prompt: str | None = None
    """Optional system message placed before the prompt when the chat template is used."""
    end_of_response: tuple[str, ...] | None = None
    """Tokens appended after the completion; default: the tokenizer's EOS token (LLaDA: add '<|eot_id|>')."""


@dataclass
class TokenizedExample:
    input_ids: list[int]
    prompt_length: int
    completion_spans: list[tuple[int, int]] = field(repr=False)  # character span of each completion token
    num_end_tokens: int


def _prompt_ids(tokenizer: Any, prompt: Any, fmt: StudentFormat) -> list[int]:
    template = fmt.use_chat_template and getattr(tokenizer, "chat_template", None)
    if template:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if fmt.system_prompt and messages[0].get("role") != "system":
            messages = [{"role": "system", "content": fmt.system_prompt}, *messages]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    if not isinstance(prompt, str):
        prompt = "\n".join(message["content"] for message in prompt)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def end_of_response_ids(tokenizer: Any, fmt: StudentFormat) -> list[int]:
    """Ids appended after every completion (must be single tokens of the vocabulary)."""
    tokens = fmt.end_of_response if fmt.end_of_response is not None else (tokenizer.eos_token,)
    ids = []
    for token in tokens:
        token_id = tokenizer.convert_tokens_to_ids(token) if token is not None else None
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"End-of-response token {token!r} is not a single token of the student tokenizer.")
        ids.append(int(token_id))
    return ids


def tokenize_example(tokenizer: Any, prompt: Any, completion: str, fmt: StudentFormat = StudentFormat()) -> TokenizedExample:
    """Tokenise prompt (templated) and completion separately, keeping completion character offsets."""
    prompt_ids = _prompt_ids(tokenizer, prompt, fmt)
    encoded = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)
    end_ids = end_of_response_ids(tokenizer, fmt)
    return TokenizedExample(
        input_ids=list(prompt_ids) + list(encoded["input_ids"]) + end_ids,
        prompt_length=len(prompt_ids),
        completion_spans=[tuple(span) for span in encoded["offset_mapping"]],
        num_end_tokens=len(end_ids),
    )


def tokenize_scored_row(
    row: Mapping[str, Any],
    tokenizer: Any,
    num_buckets: int,
    ordering: Ordering = "hard_to_easy",
    fmt: StudentFormat = StudentFormat(),
    index: int | None = None,
) -> dict[str, Any]:
    """A raw scored row -> prepared fields, projecting the teacher's bucket ids onto student tokens."""
    prompt, completion = schema.split_prompt_completion(row, index)
    schema.validate_teacher_scores(row, completion, index, required=(schema.TEACHER_START, schema.TEACHER_END, schema.TEACHER_BUCKET))
    example = tokenize_example(tokenizer, prompt, completion, fmt)
    try:
        projected = project_buckets(
            row[schema.TEACHER_START], row[schema.TEACHER_END], row[schema.TEACHER_BUCKET],
            example.completion_spans, len(completion), num_buckets,
        )
    except ValueError as error:
        raise schema.SchemaError(f"row {index}: field '{schema.TEACHER_BUCKET}': {error}") from None
    buckets = np.concatenate([projected, np.full(example.num_end_tokens, easiest_bucket(num_buckets, ordering))])
    return {schema.INPUT_IDS: example.input_ids, schema.PROMPT_LENGTH: example.prompt_length, schema.BUCKET_IDS: buckets}


def prepare_dataset(
    dataset: Dataset,
    tokenizer: Any,
    *,
    num_buckets: int = 8,
    metric: str = "nll",
    ordering: Ordering = "hard_to_easy",
    seed: int = 0,
    fmt: StudentFormat = StudentFormat(),
    num_proc: int | None = None,
) -> Dataset:
    """Tokenise a scored data set for one student and cut equal-mass buckets over its completion tokens.

    Adds ``input_ids``, ``prompt_length``, ``bucket_ids``, ``example_id`` and ``student_score`` (the
    projected teacher metric per completion token). Equal mass holds over the completion tokens of the
    whole data set (end-of-response tokens excluded, they take the easiest bucket).
    """
    if metric not in schema.METRIC_COLUMNS:
        raise ValueError(f"Unknown metric {metric!r}; choose one of {sorted(schema.METRIC_COLUMNS)}.")
    score_column = schema.METRIC_COLUMNS[metric]

    def tokenize(row: dict[str, Any], index: int) -> dict[str, Any]:
        prompt, completion = schema.split_prompt_completion(row, index)
        schema.validate_teacher_scores(row, completion, index, required=(schema.TEACHER_START, schema.TEACHER_END, score_column))
        example = tokenize_example(tokenizer, prompt, completion, fmt)
        scores = project_scores(
            row[schema.TEACHER_START], row[schema.TEACHER_END], row[score_column], example.completion_spans, len(completion)
        )
        return {
            schema.INPUT_IDS: example.input_ids,
            schema.PROMPT_LENGTH: example.prompt_length,
            "student_score": scores.astype(np.float32),
            "num_end_tokens": example.num_end_tokens,
            schema.EXAMPLE_ID: index,
        }

    tokenized = dataset.map(tokenize, with_indices=True, num_proc=num_proc, desc="Tokenising for the student")
    scores = tokenized["student_score"]
    lengths = np.array([len(row_scores) for row_scores in scores])
    flat = np.concatenate([np.asarray(row_scores, dtype=np.float64) for row_scores in scores]) if len(scores) else np.zeros(0)
    bucket_ids, thresholds = equal_mass_buckets(flat, num_buckets, ordering, seed)
    logger.info("Student-token bucket thresholds (%s, %s): %s", metric, ordering, thresholds.tolist())
    per_row = np.split(bucket_ids, np.cumsum(lengths)[:-1])
    end_bucket = easiest_bucket(num_buckets, ordering)
    end_counts = tokenized["num_end_tokens"]
    column = [np.concatenate([row_ids, np.full(n_end, end_bucket, dtype=np.int8)]).tolist() for row_ids, n_end in zip(per_row, end_counts)]
    return tokenized.remove_columns("num_end_tokens").add_column(schema.BUCKET_IDS, column)

