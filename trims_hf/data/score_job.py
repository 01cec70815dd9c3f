"""The ``trims score`` job: score a data set with a teacher in resumable chunks, cut buckets, write the folder.

Work is cut into row chunks that each process of ``accelerate launch`` scores and saves atomically in a hidden
sibling of the output folder, so a rerun resumes and the merged result is the same for any number of processes.
The output folder (parquet + card) appears only when complete. Everything a user can get wrong (the output
folder, Hub access, every row) is checked before the teacher's weights load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset, Features, List, Value, concatenate_datasets, load_dataset
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..distributed import balanced_shards, process_state
from ..errors import check_output_folder
from ..prompts import check_system_prompt, prompt_template, resolved_format
from ..reports import weights_fingerprint
from ..settings import DEFAULT_TEACHER, BucketConfig, ScoringOptions
from ..sources import hub_commit
from .buckets import bucket_rows, bucket_statistics
from .hub import (
    check_push_access,
    push_folder,
    save_dataset_folder,
    scored_dataset_card,
)
from .schema import (
    METRIC_COLUMNS,
    TEACHER_BUCKET,
    TEACHER_END,
    TEACHER_ENTROPY,
    TEACHER_NLL,
    TEACHER_START,
    SchemaError,
    split_prompt_completion,
)
from .scoring import EncodedRow
from .teacher import (
    check_causal_teacher,
    check_scorable,
    context_length,
    encode_dataset,
    load_teacher,
    load_teacher_tokenizer,
    position_limit,
    score_rows,
    teacher_identity,
)

logger = logging.getLogger(__name__)

# Column types of the scored format (trims_hf.data.schema) as the scorer writes them.
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


class ScoringInterrupted(KeyboardInterrupt):
    """Ctrl-C during scoring: says how much work is saved and where, so the user knows a rerun resumes."""

    def __init__(self, saved: int, total: int, folder: Path) -> None:
        super().__init__(f"{saved} of {total} chunks saved in {folder}; rerun the same command to resume.")
        self.saved, self.total, self.folder = saved, total, folder


def _work_key(rows: Sequence[EncodedRow], teacher_id: str, rows_per_chunk: int) -> str:
    """Fingerprint of everything a saved chunk depends on (the ids carry the formatting), so reruns never mix runs."""
    digest = hashlib.sha256(json.dumps([teacher_id, rows_per_chunk]).encode())
    for row in rows:
        digest.update(np.asarray(row.input_ids + (-1, row.prompt_length, -2), dtype=np.int64).tobytes())
    return digest.hexdigest()[:16]


def _chunk_path(work_dir: Path, chunk: int) -> Path:
    return work_dir / f"chunk-{chunk:06d}.parquet"


def _saved_chunks(work_dir: Path, num_chunks: int) -> int:
    return sum(_chunk_path(work_dir, c).exists() for c in range(num_chunks))


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

    Work is cut into chunks of :meth:`ScoringOptions.rows_per_chunk` rows; this process scores its shard of the
    chunks, balanced by tokens (:func:`trims_hf.distributed.balanced_shards`), that is not already saved under
    ``work_dir``, and saves each chunk atomically. The main process (index 0) then merges all chunks in the original row
    order and returns the dataset; other processes return ``None``. Without explicit indices they come
    from :func:`trims_hf.distributed.process_state` (gloo on the CPU; processes wait for each other before the merge).
    ``rows`` are this data set's :func:`encode_dataset` result when the caller already has it. Ctrl-C raises
    :class:`ScoringInterrupted`, which says how many chunks are saved.
    """
    barrier: Callable[[], None] = lambda: None  # explicit indices mean the caller synchronises
    if process_index is None or num_processes is None:
        state = process_state(model.device.type)
        process_index, num_processes, barrier = state.process_index, state.num_processes, state.wait_for_everyone
    if rows is None:
        rows = encode_dataset(dataset, tokenizer, options, context_length(model.config, options.teacher_max_length),
                              position_limit(model.config))
    completions = [split_prompt_completion(row, i)[1] for i, row in enumerate(dataset)]
    size = options.rows_per_chunk(len(rows))
    num_chunks = math.ceil(len(rows) / size)
    # the teacher's weights (sampled: cheap at billions of weights) and dtype in the key: a teacher folder retrained,
    # a moved Hub revision or another dtype on resuming never mixes its scores with the saved ones
    teacher_key = json.dumps([teacher_id or model.name_or_path, weights_fingerprint(model, sample=64)])
    work_dir = Path(work_dir) / _work_key(rows, teacher_key, size)
    work_dir.mkdir(parents=True, exist_ok=True)
    done = _saved_chunks(work_dir, num_chunks)
    if done and process_index == 0:
        logger.info("resuming: %d of %d chunks done (saved in %s)", done, num_chunks, work_dir)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    tokens = [sum(len(r.input_ids) for r in rows[c * size : (c + 1) * size])
              for c in range(num_chunks)]
    mine = [c for c in balanced_shards(tokens, num_processes)[process_index] if not _chunk_path(work_dir, c).exists()]
    total = sum(len(r.completion_ids) for c in mine for r in rows[c * size : (c + 1) * size])
    temporary = work_dir / f".chunk.{process_index}.{os.getpid()}.{uuid.uuid4().hex}.tmp"  # another run's is not ours
    try:
        with tqdm(total=total, unit="tok", desc=f"scoring [{process_index}]", disable=total == 0) as progress:
            for chunk in mine:
                part = slice(chunk * size, (chunk + 1) * size)
                scored = score_rows(model, rows[part], completions[part], options, pad_token_id, progress)
                columns = {ROW_INDEX: [r.index for r in rows[part]]} | {name: [s[name] for s in scored] for name in scored[0]}
                Dataset.from_dict(columns).to_parquet(str(temporary))
                os.replace(temporary, _chunk_path(work_dir, chunk))
    except KeyboardInterrupt:
        raise ScoringInterrupted(_saved_chunks(work_dir, num_chunks), num_chunks, work_dir) from None
    finally:  # whatever stopped the run, a chunk half-written is no chunk
        temporary.unlink(missing_ok=True)
    barrier()
    if process_index != 0:
        return None
    return _merge_chunks(dataset, work_dir, num_chunks)


def _merge_chunks(dataset: Dataset, work_dir: Path, num_chunks: int) -> Dataset:
    missing = [c for c in range(num_chunks) if not _chunk_path(work_dir, c).exists()]
    if missing:
        raise RuntimeError(
            f"Scoring chunks {missing} are missing in {work_dir}; run the remaining processes (or rerun to resume).")
    files = [str(_chunk_path(work_dir, c)) for c in range(num_chunks)]
    scores = load_dataset("parquet", data_files=files, split="train", keep_in_memory=True)
    if scores[ROW_INDEX] != list(range(len(dataset))):
        raise RuntimeError(f"Scoring chunks in {work_dir} do not cover rows 0..{len(dataset) - 1} in order.")
    features = {name: SCORE_FEATURES[name] for name in (TEACHER_START, TEACHER_END, TEACHER_NLL, TEACHER_ENTROPY)}
    scores = scores.select_columns(list(features)).cast(Features(features))
    return concatenate_datasets([dataset, scores], axis=1)


def add_teacher_buckets(dataset: Dataset, config: BucketConfig | None = None,
                        kept: Sequence[int] | None = None) -> tuple[Dataset, list[float]]:
    """Cut the teacher completion tokens of the data set into equal-mass buckets (paper §3.2).

    ``kept`` is, per row, how many completion tokens fall within the training length; with
    ``config.quantile_tokens == "kept"`` the quantiles are cut over those (:func:`trims_hf.data.buckets.bucket_rows`).
    Returns the data set with a ``teacher_bucket`` column and the thresholds (for the card).
    """
    config = config or BucketConfig()
    per_row = dataset[METRIC_COLUMNS[config.metric]]
    if not any(per_row):
        raise SchemaError(f"field '{METRIC_COLUMNS[config.metric]}': the data set has no completion tokens to bucket.")
    ids, thresholds = bucket_rows(per_row, config, kept)
    if TEACHER_BUCKET in dataset.column_names:
        dataset = dataset.remove_columns(TEACHER_BUCKET)
    return (dataset.add_column(TEACHER_BUCKET, [i.tolist() for i in ids], feature=SCORE_FEATURES[TEACHER_BUCKET]),
            thresholds.tolist())


def encode_for_scoring(dataset: Dataset, tokenizer: PreTrainedTokenizerBase, config: Any, options: ScoringOptions,
                       buckets: BucketConfig) -> tuple[list[EncodedRow], list[int] | None]:
    """Every row encoded for the teacher and checked with its tokenizer and config alone (``config`` may be None when
    ``options.teacher_max_length`` is set): the format, each row within the teacher's context, and with
    ``quantile_tokens="kept"`` a completion token within ``train_max_length`` in some row. Returns the rows and, with
    ``kept``, each row's kept completion tokens (:func:`kept_completion_tokens`)."""
    check_system_prompt(tokenizer, options)
    if (rendered := resolved_format(tokenizer, options)) != options.prompt_format:
        logger.info("note: the teacher's tokenizer has no chat template, so the prompts are rendered as %s text (the "
                    "card's prompt_format says so).", rendered)
    rows = encode_dataset(dataset, tokenizer, options, context_length(config, options.teacher_max_length),
                          position_limit(config))
    kept = kept_completion_tokens(rows, options) if buckets.quantile_tokens == "kept" else None
    if kept is not None and not any(kept):
        raise SchemaError(f"no row has a completion token within train_max_length={options.train_max_length} teacher "
                          f"tokens (the prompts are longer); raise it, or cut quantiles over quantile_tokens=all.")
    return rows, kept


def kept_completion_tokens(rows: Sequence[EncodedRow], options: ScoringOptions) -> list[int]:
    """Per row, the teacher completion tokens within ``options.train_max_length`` (prompt included)."""
    return [max(0, min(len(r.completion_ids), options.train_max_length - r.prompt_length)) for r in rows]


def score_statistics(scored: Dataset, kept: Sequence[int] | None, num_buckets: int) -> dict[str, Any]:
    """The card's figures: mean teacher NLL and entropy over all scored tokens, and per bucket the tokens, mean
    NLL and share of the NLL over the tokens the quantiles were cut on (:func:`trims_hf.data.buckets.bucket_statistics`)."""
    nll, buckets = scored[TEACHER_NLL], scored[TEACHER_BUCKET]
    if kept is not None:
        nll, buckets = [n[:k] for n, k in zip(nll, kept)], [b[:k] for b, k in zip(buckets, kept)]
    stats = bucket_statistics(nll, buckets, num_buckets)
    return {
        "mean_teacher_nll": round(float(np.mean(np.concatenate(scored[TEACHER_NLL]))), 4),
        "mean_teacher_entropy": round(float(np.mean(np.concatenate(scored[TEACHER_ENTROPY]))), 4),
        "num_quantile_tokens": stats["completion_tokens"],
        "bucket_statistics": [{"bucket": b["bucket"], "tokens": b["tokens"], "nll_share": round(b["nll_share"], 4),
                               "mean_nll": None if b["mean_nll"] is None else round(b["mean_nll"], 4)}
                              for b in stats["per_bucket"]],
    }


def remove_work_dir(work_dir: str | os.PathLike) -> None:
    """Drop saved chunks once their result is safely written (or when the input was bad)."""
    shutil.rmtree(work_dir, ignore_errors=True)


def work_dir_for(output: str | os.PathLike) -> Path:
    """Where an output folder's resumable chunks live: a hidden sibling, so the output itself appears only when complete."""
    output = Path(output)
    return output.with_name(f".{output.name}.trims-work")


def build_scored_dataset(
    dataset: Dataset | Callable[[], Dataset],
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

    Cheap failures come first: the output folder, Hub write access, then the rows (``dataset`` may be a function
    that loads them, so they load only after those checks) with every row's format and length, checked with the
    teacher's tokenizer and config only; the teacher's weights load after that. On bad scores the partial
    work is removed; on a crash or Ctrl-C (:class:`ScoringInterrupted`) it is kept for resuming.
    Returns the folder on the main process, ``None`` on the others.
    """
    options, buckets = options or ScoringOptions(), buckets or BucketConfig()
    output = Path(output)
    check_output_folder(output, overwrite)
    if push_to_hub:
        check_push_access(push_to_hub, token)
    if callable(dataset):
        dataset = dataset()
    check_scorable(dataset)
    tokenizer, config = (loaded_teacher[1], loaded_teacher[0].config) if loaded_teacher else load_teacher_tokenizer(
        teacher, gguf_file, revision)
    check_causal_teacher(config, teacher)
    rows, kept = encode_for_scoring(dataset, tokenizer, config, options, buckets)
    model, tokenizer = loaded_teacher or load_teacher(teacher, gguf_file, revision, loaded=(tokenizer, config))
    work_dir = work_dir_for(output)
    teacher_id = json.dumps([str(Path(teacher).resolve()) if Path(teacher).exists() else teacher, gguf_file, revision])
    try:
        scored = score_dataset(model, tokenizer, dataset, work_dir, options, teacher_id, rows=rows)
    except SchemaError:
        remove_work_dir(work_dir)
        raise
    if scored is None:
        return None
    scored, thresholds = add_teacher_buckets(scored, buckets, kept)
    metadata = {
        **teacher_identity(teacher, gguf_file, loaded=loaded_teacher is not None),
        "teacher_revision": hub_commit(teacher, gguf_file, revision),
        "teacher_dtype": str(model.dtype).removeprefix("torch."),
        "source_dataset": source,
        "num_rows": len(scored),
        "num_teacher_tokens": sum(len(r.completion_ids) for r in rows),
        "num_buckets": buckets.num_buckets,
        "bucket_ordering": buckets.bucket_ordering,
        "metric": buckets.metric,
        "bucket_seed": buckets.bucket_seed if buckets.bucket_ordering == "random" else None,
        "quantile_tokens": buckets.quantile_tokens,
        "train_max_length": options.train_max_length if kept is not None else None,
        "thresholds": thresholds,
        **score_statistics(scored, kept, buckets.num_buckets),
        "prompt_format": resolved_format(tokenizer, options),
        "system_prompt": options.system_prompt,
        "prompt_template": prompt_template(tokenizer, options),
        "completion_tokenization": "completion tokenised on its own (no special tokens, no EOS scored), after the prompt",
        "teacher_max_length": context_length(config, options.teacher_max_length),
        "truncated_rows": [r.index for r in rows if r.truncated],
    } | (extra_metadata or {})
    name = metadata["teacher"]
    card = scored_dataset_card(metadata, license=license, pretty_name=f"TRIMS scores of {source or 'a dataset'} by {name}")
    folder = save_dataset_folder(scored, output, card, overwrite=overwrite)
    remove_work_dir(work_dir)
    if push_to_hub:
        try:
            push_folder(folder, push_to_hub, token=token, private=private)
        except Exception as error:
            raise RuntimeError(f"Push to {push_to_hub} failed ({error}); the scored dataset is kept at {folder}.") from error
    return folder
