"""The ``trims score`` job: score a data set with a teacher in resumable chunks, cut buckets, write the folder.

Work is cut into fixed row chunks that each process of ``accelerate launch`` scores and saves atomically
in a hidden sibling of the output folder, so a rerun resumes and the merged result is the same for any
number of processes. The output folder (parquet + card) appears only when complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset, Features, List, Value, concatenate_datasets, load_dataset
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..buckets import bucket_rows
from ..hub import check_push_access, push_folder, save_dataset_folder, scored_dataset_card
from ..prompts import prompt_template, resolved_format
from ..schema import METRIC_COLUMNS, TEACHER_BUCKET, TEACHER_END, TEACHER_ENTROPY, TEACHER_NLL, TEACHER_START, SchemaError, split_prompt_completion
from ..scoring import EncodedRow
from ..settings import DEFAULT_TEACHER, BucketConfig, ScoringOptions
from ..teacher import context_length, encode_dataset, load_teacher, score_rows, teacher_revision

# Column types of the scored format (trims_hf.schema) as the scorer writes them.
SCORE_FEATURES = Features(
    {
        TEACHER_START: List(Value("int32")),
        TEACHER_END: List(Value("int32")),
        TEACHER_NLL: List(Value("float32")),
        TEACHER_ENTROPY: List(Value("float32")),
        TEACHER_BUCKET: List(Value("int8")),
    }
)

ROW_INDEX = "row_index"


def _work_key(rows: Sequence[EncodedRow], teacher_id: str, rows_per_work_chunk: int) -> str:
    """Fingerprint of everything a saved chunk depends on (the ids carry the formatting), so reruns never mix runs."""
    digest = hashlib.sha256(json.dumps([teacher_id, rows_per_work_chunk]).encode())
    for row in rows:
        digest.update(np.asarray(row.input_ids + (-1, row.prompt_length, -2), dtype=np.int64).tobytes())
    return digest.hexdigest()[:16]


def _chunk_path(work_dir: Path, chunk: int) -> Path:
    return work_dir / f"chunk-{chunk:06d}.parquet"


def score_dataset(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    work_dir: str | os.PathLike,
    options: ScoringOptions = ScoringOptions(),
    teacher_id: str | None = None,
    process_index: int | None = None,
    num_processes: int | None = None,
    rows: list[EncodedRow] | None = None,
) -> Dataset | None:
    """Score ``dataset`` and return it with the per-teacher-token span, NLL and entropy columns added.

    Work is cut into chunks of ``rows_per_work_chunk`` rows; this process scores chunks
    ``process_index, process_index + num_processes, ...`` that are not already saved under ``work_dir``
    and saves each atomically. The main process (index 0) then merges all chunks in the original row
    order and returns the dataset; other processes return ``None``. Without explicit indices they come
    from ``accelerate.PartialState`` (and processes wait for each other before the merge). ``rows`` are
    this data set's :func:`encode_dataset` result when the caller already has it.
    """
    barrier: Callable[[], None] = lambda: None  # noqa: E731 - explicit indices mean the caller synchronises
    if process_index is None or num_processes is None:
        from accelerate import PartialState

        state = PartialState()
        process_index, num_processes, barrier = state.process_index, state.num_processes, state.wait_for_everyone
    if rows is None:
        rows = encode_dataset(dataset, tokenizer, options, context_length(model, options.max_length))
    completions = [split_prompt_completion(row, i)[1] for i, row in enumerate(dataset)]
    work_dir = Path(work_dir) / _work_key(rows, teacher_id or model.name_or_path, options.rows_per_work_chunk)
    work_dir.mkdir(parents=True, exist_ok=True)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    size = options.rows_per_work_chunk
    mine = [c for c in range(process_index, math.ceil(len(rows) / size), num_processes)
            if not _chunk_path(work_dir, c).exists()]
    total = sum(len(r.completion_ids) for c in mine for r in rows[c * size : (c + 1) * size])
    with tqdm(total=total, unit="tok", desc=f"scoring [{process_index}]", disable=total == 0) as progress:
        for chunk in mine:
            part = slice(chunk * size, (chunk + 1) * size)
            scored = score_rows(model, rows[part], completions[part], options, pad_token_id, progress)
            columns = {ROW_INDEX: [r.index for r in rows[part]]} | {name: [s[name] for s in scored] for name in scored[0]}
            temporary = work_dir / f".{_chunk_path(work_dir, chunk).name}.{process_index}.tmp"
            Dataset.from_dict(columns).to_parquet(str(temporary))
            os.replace(temporary, _chunk_path(work_dir, chunk))
    barrier()
    if process_index != 0:
        return None
    return _merge_chunks(dataset, work_dir, math.ceil(len(rows) / size))


def _merge_chunks(dataset: Dataset, work_dir: Path, num_chunks: int) -> Dataset:
    missing = [c for c in range(num_chunks) if not _chunk_path(work_dir, c).exists()]
    if missing:
        raise RuntimeError(f"Scoring chunks {missing} are missing in {work_dir}; run the remaining processes (or rerun to resume).")
    files = [str(_chunk_path(work_dir, c)) for c in range(num_chunks)]
    scores = load_dataset("parquet", data_files=files, split="train", keep_in_memory=True)
    if scores[ROW_INDEX] != list(range(len(dataset))):
        raise RuntimeError(f"Scoring chunks in {work_dir} do not cover rows 0..{len(dataset) - 1} in order.")
    features = {name: SCORE_FEATURES[name] for name in (TEACHER_START, TEACHER_END, TEACHER_NLL, TEACHER_ENTROPY)}
    scores = scores.select_columns(list(features)).cast(Features(features))
    return concatenate_datasets([dataset, scores], axis=1)


def add_teacher_buckets(dataset: Dataset, config: BucketConfig | None = None) -> tuple[Dataset, list[float]]:
    """Cut ALL teacher completion tokens of the data set into equal-mass buckets (paper §3.2).

    Returns the data set with a ``teacher_bucket`` column and the thresholds (for the card).
    """
    config = config or BucketConfig()
    per_row = dataset[METRIC_COLUMNS[config.metric]]
    if not any(per_row):
        raise SchemaError(f"row 0: field '{METRIC_COLUMNS[config.metric]}': the data set has no completion tokens to bucket.")
    ids, thresholds = bucket_rows(per_row, config)
    if TEACHER_BUCKET in dataset.column_names:
        dataset = dataset.remove_columns(TEACHER_BUCKET)
    return dataset.add_column(TEACHER_BUCKET, [i.tolist() for i in ids], feature=SCORE_FEATURES[TEACHER_BUCKET]), thresholds.tolist()


def remove_work_dir(work_dir: str | os.PathLike) -> None:
    """Drop saved chunks once their result is safely written (or when the input was bad)."""
    shutil.rmtree(work_dir, ignore_errors=True)


def work_dir_for(output: str | os.PathLike) -> Path:
    """Where an output folder's resumable chunks live: a hidden sibling, so the output itself appears only when complete."""
    output = Path(output)
    return output.with_name(f".{output.name}.trims-work")


def build_scored_dataset(
    dataset: Dataset,
    output: str | os.PathLike,
    teacher: str = DEFAULT_TEACHER,
    *,
    gguf_file: str | None = None,
    revision: str | None = None,
    options: ScoringOptions | None = None,
    buckets: BucketConfig | None = None,
    source: str | None = None,
    license: str | None = None,
    push_to_hub: str | None = None,
    token: str | None = None,
    private: bool | None = None,
    overwrite: bool = False,
    loaded_teacher: tuple[PreTrainedModel, PreTrainedTokenizerBase] | None = None,
    extra_metadata: dict[str, Any] | None = None,
) -> Path | None:
    """Score, bucket, write the dataset folder with its card, and optionally push it: the whole ``trims score``.

    Cheap failures come first: Hub write access, then every row's format and length, then an existing
    output folder. On bad scores the partial work is removed; on a crash it is kept for resuming.
    Returns the folder on the main process, ``None`` on the others.
    """
    options, buckets = options or ScoringOptions(), buckets or BucketConfig()
    if push_to_hub:
        check_push_access(push_to_hub, token)
    model, tokenizer = loaded_teacher or load_teacher(teacher, gguf_file, revision)
    max_length = context_length(model, options.max_length)
    rows = encode_dataset(dataset, tokenizer, options, max_length)
    output = Path(output)
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} already exists; choose another output folder or pass overwrite.")
    work_dir = work_dir_for(output)
    try:
        scored = score_dataset(model, tokenizer, dataset, work_dir, options, teacher, rows=rows)
    except SchemaError:
        remove_work_dir(work_dir)
        raise
    if scored is None:
        return None
    scored, thresholds = add_teacher_buckets(scored, buckets)
    metadata = {
        "teacher": teacher,
        "teacher_revision": teacher_revision(model, revision),
        "teacher_gguf_file": gguf_file,
        "source_dataset": source,
        "num_rows": len(scored),
        "num_teacher_tokens": sum(len(r.completion_ids) for r in rows),
        **dataclasses.asdict(buckets),
        "thresholds": thresholds,
        "prompt_format": resolved_format(tokenizer, options),
        "system_prompt": options.system_prompt,
        "prompt_template": prompt_template(tokenizer, options),
        "completion_tokenization": "completion tokenised on its own (no special tokens, no EOS scored), after the prompt",
        "max_length": max_length,
        "truncated_rows": [r.index for r in rows if r.truncated],
        "teacher_dtype": str(model.dtype).removeprefix("torch."),
    } | (extra_metadata or {})
    card = scored_dataset_card(metadata, license=license, pretty_name=f"TRIMS scores of {source or 'a dataset'} by {teacher}")
    folder = save_dataset_folder(scored, output, card, overwrite=overwrite)
    remove_work_dir(work_dir)
    if push_to_hub:
        try:
            push_folder(folder, push_to_hub, token=token, private=private)
        except Exception as error:
            raise RuntimeError(f"Push to {push_to_hub} failed ({error}); the scored dataset is kept at {folder}.") from error
    return folder
