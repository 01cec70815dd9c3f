"""The scored-dataset format: one definition shared by the scorer (writer) and the collator (reader).

A *scored* row is what the Hub dataset holds: the text and, per teacher token of the completion,
its character span in the completion text, its NLL, its entropy and its teacher-side bucket id.
A *prepared* row is the same example tokenised for one student: ``input_ids``, the prompt length and
one bucket id per completion token.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..settings import MAX_BUCKETS

# Text columns (TRL's prompt-completion format; "prompt" may also be a list of chat messages).
PROMPT = "prompt"
COMPLETION = "completion"
MESSAGES = "messages"

# Per teacher token of the completion (all lists have the same length).
TEACHER_START = "teacher_token_start"  # character offset where the token starts in the completion
TEACHER_END = "teacher_token_end"  # character offset where it ends (exclusive)
TEACHER_NLL = "teacher_nll"  # -log p_T(y_i | x, y_<i)
TEACHER_ENTROPY = "teacher_entropy"  # entropy of the teacher's predictive distribution at y_i
TEACHER_BUCKET = "teacher_bucket"  # bucket id over teacher tokens (0 = first to decode)

# Prepared for one student.
INPUT_IDS = "input_ids"
PROMPT_LENGTH = "prompt_length"
BUCKET_IDS = "bucket_ids"  # one per completion token (input_ids[prompt_length:])
EXAMPLE_ID = "example_id"  # stable row id, used by the fixed-subset trajectory selection
STUDENT_SCORE = "student_score"  # the teacher metric per kept completion token (NaN: no score); end tokens follow

# A collated batch (TrimsDataCollator writes it; the loss, MDLMTrainer and the plain-Trainer hooks read it).
IGNORE_INDEX = -100
"""The ``labels`` value of a position that is no response token (the prompt, padding)."""
LOSS_KEYS = ("labels", "masked", "loss_weights", "t", "is_trajectory")
"""Keys of a collated batch that only the loss reads, never the model's forward."""
EPOCH_KEY = "epoch"
"""Batch key: per row, the epoch its masks were drawn for, or :data:`UNFOLLOWED_EPOCH` when nothing advances it."""
UNFOLLOWED_EPOCH = -1

TEACHER_LIST_COLUMNS = (TEACHER_START, TEACHER_END, TEACHER_NLL, TEACHER_ENTROPY, TEACHER_BUCKET)
METRIC_COLUMNS = {"nll": TEACHER_NLL, "entropy": TEACHER_ENTROPY}


def disjoint_spans(offsets: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Character spans as the scorer stores them: byte-level tokens of one multi-byte character share its span;
    the first gets it, the rest zero width, so spans never overlap."""
    spans, previous_end = [], 0
    for start, end in offsets:
        start = max(start, previous_end)
        end = max(end, start)
        spans.append((start, end))
        previous_end = end
    return tuple(spans)


def has_teacher_scores(column_names: Sequence[str], metric: str) -> bool:
    """Whether a data set's columns hold the teacher spans and the ``metric`` scores buckets are cut on."""
    return {TEACHER_START, TEACHER_END, METRIC_COLUMNS[metric]} <= set(column_names)


class SchemaError(ValueError):
    """A row does not follow the scored or prepared format; the message names the row and field."""


def check_metric_column(column_names: Sequence[str], metric: str) -> None:
    """Rows scored by a teacher (spans present) but without the ``metric`` column would pass as unscored rows, with
    no buckets: refused, naming the metrics they do hold."""
    spans = {TEACHER_START, TEACHER_END} <= set(column_names)
    column = METRIC_COLUMNS[metric]
    if spans and column not in column_names:
        held = [name for name, held_column in METRIC_COLUMNS.items() if held_column in column_names]
        raise SchemaError(
            f"column '{column}': the rows hold teacher spans but no {metric} scores to cut buckets on"
            + (f"; they hold {', '.join(held)}: set metric={held[0]}" if held else "; score them with `trims score`")
            + ".")


def as_prompt_completion(dataset: Any, prompt_column: str, completion_column: str,
                         names: tuple[str, str] = ("prompt column", "completion column")) -> Any:
    """A ``datasets.Dataset`` with its prompt and completion columns renamed to :data:`PROMPT` / :data:`COMPLETION`
    (other columns kept; a column already named so is replaced): how any row source becomes the rows a teacher
    scores and a student trains on. ``names`` are what the error calls the two columns (a command's flags)."""
    for name, column in zip(names, (prompt_column, completion_column)):
        if column not in dataset.column_names:
            chat = (f"; the rows are chat '{MESSAGES}': give the prompt (the turns before the answer) and the completion "
                    "(the last assistant turn's text) as two columns" if MESSAGES in dataset.column_names else "")
            raise SchemaError(f"{name} {column}: no such column (columns: {', '.join(dataset.column_names)}){chat}.")
    if prompt_column == completion_column:
        raise SchemaError(f"{names[0]} and {names[1]} both name the column {prompt_column}; a row's prompt and "
                          "completion are two columns.")
    # through names of their own, so the two may be each other's targets (--prompt-column completion and back)
    apart = {prompt_column: f"{PROMPT}\0", completion_column: f"{COMPLETION}\0"}
    dataset = dataset.rename_columns(apart)
    dataset = dataset.remove_columns([name for name in (PROMPT, COMPLETION) if name in dataset.column_names])
    return dataset.rename_columns({f"{PROMPT}\0": PROMPT, f"{COMPLETION}\0": COMPLETION})


def _where(index: int | None) -> str:
    return f"row {index}" if index is not None else "row"


def _check_messages(messages: Any, field: str, index: int | None) -> None:
    """``messages`` is a list of chat messages, each a ``{role, content}`` mapping of texts: anything else would fail
    deep inside the prompt renderer, and a message without its content would be scored as an empty one."""
    if not isinstance(messages, (list, tuple)):
        raise SchemaError(f"{_where(index)}: field '{field}' is {reprlib.repr(messages)}; expected a list of chat "
                          "messages {role, content}.")
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping) or not all(isinstance(message.get(key), str) for key in ("role", "content")):
            raise SchemaError(f"{_where(index)}: field '{field}' has {reprlib.repr(message)} as message {position}; a "
                              "chat message is {role, content}, both text.")


def _check_prompt(prompt: Any, field: str, index: int | None) -> None:
    """A prompt is a text or a list of chat messages (:func:`_check_messages`)."""
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, (list, tuple)):
        raise SchemaError(f"{_where(index)}: field '{field}' is {reprlib.repr(prompt)}; a prompt is a text or a list "
                          "of chat messages {role, content}.")
    _check_messages(prompt, field, index)


def split_prompt_completion(row: Mapping[str, Any], index: int | None = None) -> tuple[Any, str]:
    """Return ``(prompt, completion_text)`` from a prompt/completion row or a chat ``messages`` row.

    ``prompt`` is a string or a list of chat messages, checked (:func:`_check_prompt`); for ``messages`` rows the
    last message must be the assistant's and is the completion.
    """
    if MESSAGES in row and row[MESSAGES] is not None and PROMPT not in row:
        messages = row[MESSAGES]
        _check_messages(messages, MESSAGES, index)
        if not messages or messages[-1].get("role") != "assistant":
            raise SchemaError(f"{_where(index)}: field '{MESSAGES}' must end with an assistant message.")
        prompt, completion = list(messages[:-1]), messages[-1].get("content")
    else:
        for field in (PROMPT, COMPLETION):
            if field not in row or row[field] is None:
                raise SchemaError(f"{_where(index)}: field '{field}' is missing or null.")
        prompt, completion = row[PROMPT], row[COMPLETION]
        _check_prompt(prompt, PROMPT, index)
        if isinstance(completion, list):  # conversational completion: one assistant message
            _check_messages(completion, COMPLETION, index)
            if len(completion) != 1 or completion[0].get("role") != "assistant":
                raise SchemaError(f"{_where(index)}: field '{COMPLETION}' must be a string or one assistant message.")
            completion = completion[0].get("content")
    if not isinstance(completion, str):
        raise SchemaError(f"{_where(index)}: field '{COMPLETION}' is {reprlib.repr(completion)}; a completion is a "
                          "text or one assistant message.")
    if not completion.strip():
        raise SchemaError(f"{_where(index)}: field '{COMPLETION}' is empty.")
    return prompt, completion


def validate_teacher_scores(row: Mapping[str, Any], completion: str, index: int | None = None,
                            required: Sequence[str] = (TEACHER_START, TEACHER_END, TEACHER_NLL)) -> None:
    """Check the per-teacher-token lists of scored data (ours, or made elsewhere): present, equal length, scores
    finite and >= 0 (an NLL or an entropy), bucket ids that fit the stored form, spans inside the text and in order.

    ``teacher_bucket`` is checked as a bucket id, not against a run's K: students recompute their buckets from the
    spans and scores, so a set scored with K = 8 trains with ``num_buckets`` 4 too.
    """
    missing = [field for field in required if row.get(field) is None]
    if missing:
        raise SchemaError(f"{_where(index)}: missing field(s) {missing}.")
    present = [field for field in TEACHER_LIST_COLUMNS if row.get(field) is not None]
    lengths = {field: len(row[field]) for field in present}
    if len(set(lengths.values())) > 1:
        raise SchemaError(f"{_where(index)}: per-token fields have different lengths {lengths}.")
    if not lengths or next(iter(lengths.values())) == 0:
        raise SchemaError(f"{_where(index)}: the completion has no scored teacher tokens.")
    for field in (TEACHER_NLL, TEACHER_ENTROPY):
        for position, value in enumerate(row.get(field) or ()):
            if value is None or not 0 <= value < math.inf:  # NaN fails too
                raise SchemaError(f"{_where(index)}: field '{field}' has {value!r} at token {position}; a teacher score "
                                  "is a finite number >= 0.")
    for position, value in enumerate(row.get(TEACHER_BUCKET) or ()):
        if value is None or not 0 <= value < MAX_BUCKETS or value != int(value):  # NaN fails the range
            raise SchemaError(f"{_where(index)}: field '{TEACHER_BUCKET}' has {value!r} at token {position}; a bucket id "
                              f"is a whole number in [0, {MAX_BUCKETS}).")
    previous_start = 0
    for position, (start, end) in enumerate(zip(row[TEACHER_START], row[TEACHER_END])):
        if not all(isinstance(v, numbers.Integral) or (isinstance(v, numbers.Real) and float(v).is_integer())
                   for v in (start, end)):
            raise SchemaError(f"{_where(index)}: fields '{TEACHER_START}' / '{TEACHER_END}': teacher span {position} = "
                              f"[{start!r}, {end!r}); a span's ends are character offsets, whole numbers.")
        # Byte-level tokenizers may split one character over several tokens, so spans can share characters;
        # they must lie inside the text and start in order.
        if not (0 <= start <= end <= len(completion)) or start < previous_start:
            raise SchemaError(
                f"{_where(index)}: fields '{TEACHER_START}' / '{TEACHER_END}': teacher span {position} = [{start}, {end}) "
                f"does not match the completion text (length {len(completion)}, previous span started at {previous_start})."
            )
        previous_start = start


def _check_whole_numbers(values: Any, index: int | None, name: str, meaning: str) -> np.ndarray:
    """``values`` (a list, array or tensor) are whole numbers >= 0: integers, or floats that are whole. numpy would
    cast a float down, read a string's characters, and a negative id as the loss's ignore index, all silently.
    Returns them as the array checked."""
    array = np.asarray(values)
    whole = array.dtype.kind in "iu" or (array.dtype.kind == "f" and bool(np.isfinite(array).all())
                                         and bool((array == np.floor(array)).all()))
    if array.ndim != 1 or not whole or (array.size and array.min() < 0):
        shown = values if isinstance(values, str) else array.tolist()[:8] if array.ndim else array.tolist()
        raise SchemaError(f"{_where(index)}: '{name}' must be a list of whole numbers ({meaning}), got {shown!r}.")
    return array


def check_example_ids(ids: Sequence[Any]) -> None:
    """A data set's own ``example_id`` column is kept as each row's id, so it must be one: whole numbers (the
    fixed-subset selection hashes them, and each row's masks are seeded by them), and unique (two rows sharing an id
    would share their masks and their place in the subset)."""
    first: dict[int, int] = {}
    for index, value in enumerate(ids):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not -(2**63) <= value < 2**63:
            raise SchemaError(f"row {index}: column '{EXAMPLE_ID}' is {value!r}; it is kept as the row's id, a whole "
                              "number that fits 64 bits (it seeds the row's masks and the fixed trajectory subset): make "
                              "the column such numbers, or drop it to number the rows 0, 1, ...")
        if int(value) in first:
            raise SchemaError(f"rows {first[int(value)]} and {index}: column '{EXAMPLE_ID}' is {value} in both; it is "
                              "kept as each row's id and must be unique (drop it to number the rows 0, 1, ...).")
        first[int(value)] = index


def validate_prepared(row: Mapping[str, Any], index: int | None = None, num_buckets: int | None = None,
                      mask_token_id: int | None = None, vocab_size: int | None = None) -> None:
    """Check a prepared (already tokenised) row: ids (below ``vocab_size``, the mask id not among the completion's:
    a target of the mask would teach the student to leave positions masked), prompt length and, given K, bucket ids
    aligned and in range, the end-of-response tokens in the last bucket (rows cut into fewer buckets pass the range)."""
    if row.get(INPUT_IDS) is None:
        raise SchemaError(f"{_where(index)}: missing field '{INPUT_IDS}'.")
    if row.get(PROMPT_LENGTH) is None:
        raise SchemaError(f"{_where(index)}: missing field '{PROMPT_LENGTH}'.")
    ids = _check_whole_numbers(row[INPUT_IDS], index, INPUT_IDS, "token ids, >= 0")
    length = row[PROMPT_LENGTH]
    if getattr(length, "ndim", None) == 0 and hasattr(length, "item"):  # rows read in the torch (or numpy) format
        length = length.item()
    if isinstance(length, bool) or not isinstance(length, numbers.Real) or not float(length).is_integer():
        raise SchemaError(f"{_where(index)}: '{PROMPT_LENGTH}'={length!r}: a whole number of prompt tokens.")
    n_ids, prompt_length = len(row[INPUT_IDS]), int(length)
    if prompt_length < 1:
        # Shifted students (Dream) predict token i from position i - 1: position 0 must be a visible prompt token.
        raise SchemaError(f"{_where(index)}: the prompt has no tokens ('{PROMPT_LENGTH}'={prompt_length}); "
                          "a row needs at least one (e.g. BOS).")
    if prompt_length >= n_ids:
        raise SchemaError(f"{_where(index)}: '{PROMPT_LENGTH}'={prompt_length} leaves no completion tokens in {n_ids} ids.")
    if vocab_size is not None and ids.size and ids.max() >= vocab_size:
        raise SchemaError(f"{_where(index)}: '{INPUT_IDS}' holds {int(ids.max())}, past the tokenizer's {vocab_size} "
                          "ids; prepare the rows with this tokenizer.")
    if mask_token_id is not None and (ids[prompt_length:] == mask_token_id).any():
        raise SchemaError(f"{_where(index)}: the completion holds the mask token id {mask_token_id}: a target of the "
                          "mask would teach the student to leave positions masked; remove it from the text.")
    if num_buckets is not None:
        buckets = row.get(BUCKET_IDS)
        if buckets is None:
            raise SchemaError(f"{_where(index)}: missing field '{BUCKET_IDS}' (needed for trajectory masking).")
        if len(buckets) != n_ids - prompt_length:
            raise SchemaError(
                f"{_where(index)}: '{BUCKET_IDS}' has {len(buckets)} entries but there are "
                f"{n_ids - prompt_length} completion tokens; bucket ids are not aligned with the tokens."
            )
        values = _check_whole_numbers(buckets, index, BUCKET_IDS, f"bucket ids in [0, {num_buckets})")
        if values.size and values.max() >= num_buckets:
            raise SchemaError(
                f"{_where(index)}: '{BUCKET_IDS}' must lie in [0, {num_buckets}), got {sorted(set(values.tolist()))}.")
        # prepare_dataset puts the end-of-response tokens, past the scored ones, in the last bucket
        scored = row.get(STUDENT_SCORE)
        kept = len(scored) if np.ndim(scored) == 1 else None  # a per-token list; another column of that name is not
        if kept is not None and kept < len(values) and ((end := values[kept:]) != num_buckets - 1).any():
            if (end == end[0]).all():
                raise SchemaError(
                    f"{_where(index)}: its end-of-response tokens are in bucket {int(end[0])}, the last of rows prepared "
                    f"with num_buckets={int(end[0]) + 1}, but the masking has num_buckets={num_buckets}; prepare the "
                    "rows with the masking's K, or mask with theirs.")
            raise SchemaError(
                f"{_where(index)}: '{BUCKET_IDS}' past its {kept} '{STUDENT_SCORE}' entries (the end-of-response tokens, "
                f"in bucket {num_buckets - 1}) hold {sorted(set(end.tolist()))}: the two columns are not of one "
                "preparation; prepare the rows again with trims_hf.prepare_dataset.")
