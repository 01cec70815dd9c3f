"""Teacher scoring (paper §3.1): per completion token, the teacher's NLL and predictive entropy.

One teacher-forcing pass per row. The scorer is built like a production one: rows are length-sorted
into batches under a token budget (little padding); the LM head and the log-softmax run chunk by chunk
over the completion positions only, so the ``batch x length x vocab`` float32 tensor never exists;
work is cut into fixed row chunks that each process of ``accelerate launch`` scores and saves
atomically, so a rerun resumes and the merged result is the same for any number of processes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Sequence
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset, Features, List, Value, concatenate_datasets, load_dataset
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .buckets import bucket_rows
from .prompts import prompt_template, prompt_token_ids, resolved_format
from .hub import check_push_access, push_folder, save_dataset_folder, scored_dataset_card
from .schema import (
    METRIC_COLUMNS,
    TEACHER_BUCKET,
    TEACHER_END,
    TEACHER_ENTROPY,
    TEACHER_NLL,
    TEACHER_START,
    SchemaError,
    split_prompt_completion,
    validate_teacher_scores,
)
from .settings import DEFAULT_TEACHER, BucketConfig, ScoringOptions

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


@dataclass(frozen=True)
class EncodedRow:
    """One row tokenised for the teacher: prompt + completion ids and each completion token's character span."""

    index: int
    input_ids: tuple[int, ...]
    prompt_length: int
    spans: tuple[tuple[int, int], ...]
    truncated: bool

    @property
    def completion_ids(self) -> tuple[int, ...]:
        return self.input_ids[self.prompt_length :]


def load_teacher(
    name_or_path: str = DEFAULT_TEACHER,
    gguf_file: str | None = None,
    revision: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM teacher and its tokenizer from a Hub id, a local folder, or a GGUF file.

    A path to a ``.gguf`` file may be given directly. bf16 on GPU, float32 on CPU unless ``dtype`` says otherwise.
    """
    if gguf_file is None and str(name_or_path).endswith(".gguf") and Path(name_or_path).is_file():
        name_or_path, gguf_file = str(Path(name_or_path).parent), Path(name_or_path).name
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    kwargs: dict[str, Any] = {"revision": revision, "gguf_file": gguf_file}
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **kwargs).to(device).eval()
    check_chunked_head(model)
    return model, tokenizer


def teacher_revision(model: PreTrainedModel, revision: str | None = None) -> str | None:
    """The commit the teacher was loaded from (Hub downloads record it on the config), else the requested revision."""
    return getattr(model.config, "_commit_hash", None) or revision


def check_chunked_head(model: PreTrainedModel) -> None:
    """Fail early when an architecture post-processes logits in a way :func:`token_scores` does not reproduce."""
    ids = torch.arange(8, device=model.device).remainder(model.config.vocab_size)[None]
    with torch.inference_mode():
        expected = model(input_ids=ids).logits.float()
        hidden = model.base_model(input_ids=ids).last_hidden_state
        actual = _head_logits(model, hidden)
    if not torch.allclose(actual, expected, atol=1e-3, rtol=1e-3):
        raise ValueError(f"{type(model).__name__}: logits from base model + output embeddings differ from the model's own.")


def _head_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    logits = model.get_output_embeddings()(hidden).float()
    softcap = getattr(model.config, "final_logit_softcapping", None)
    return softcap * torch.tanh(logits / softcap) if softcap else logits


def _disjoint_spans(offsets: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Byte-level tokens of one multi-byte character share its span; give it to the first, zero width to the rest."""
    spans, previous_end = [], 0
    for start, end in offsets:
        start = max(start, previous_end)
        end = max(end, start)
        spans.append((start, end))
        previous_end = end
    return tuple(spans)


def context_length(model: PreTrainedModel, max_length: int | None = None) -> int:
    """The explicit ``max_length`` or the teacher's ``max_position_embeddings``."""
    length = max_length or getattr(model.config, "max_position_embeddings", None)
    if not length:
        raise ValueError("The teacher config has no max_position_embeddings; pass max_length.")
    return int(length)


def encode_row(row: dict, index: int, tokenizer: PreTrainedTokenizerBase, options: ScoringOptions, max_length: int) -> EncodedRow:
    """Tokenise one row; the completion separately, with character offsets, so spans index the completion text."""
    prompt, completion = split_prompt_completion(row, index)
    try:
        prompt_ids = prompt_token_ids(tokenizer, prompt, options)
    except ValueError as error:
        raise SchemaError(f"row {index}: field 'prompt': {error}") from None
    encoded = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)
    completion_ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    if not completion_ids:
        raise SchemaError(f"row {index}: field 'completion' has no teacher tokens.")
    room = max_length - len(prompt_ids)
    truncated = len(completion_ids) > room
    if truncated and (not options.truncate or room < 1):
        raise SchemaError(
            f"row {index}: field 'completion' is too long for the teacher: {len(prompt_ids)} prompt + "
            f"{len(completion_ids)} completion tokens > context {max_length} (pass a larger max_length, or truncate=True)."
        )
    completion_ids, offsets = completion_ids[:room], offsets[:room]
    return EncodedRow(index, tuple(prompt_ids) + tuple(completion_ids), len(prompt_ids), _disjoint_spans(offsets), truncated)


def encode_dataset(dataset: Dataset, tokenizer: PreTrainedTokenizerBase, options: ScoringOptions, max_length: int) -> list[EncodedRow]:
    """Tokenise and validate every row before any scoring, so bad input fails before anything is written."""
    if len(dataset) == 0:
        raise SchemaError("row 0: field 'completion': the data set has no rows, hence no completion tokens to score.")
    return [encode_row(row, index, tokenizer, options, max_length) for index, row in enumerate(dataset)]


def plan_batches(lengths: Sequence[int], max_tokens_per_batch: int) -> list[list[int]]:
    """Length-sorted batches whose padded size (rows x longest) stays within the token budget.

    Sorting longest first makes rows of one batch nearly equal in length, so padding is small.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens_per_batch:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def padding_efficiency(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Real tokens over padded tokens (1.0 = no padding)."""
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    return sum(lengths) / padded


def collate(rows: Sequence[EncodedRow], pad_token_id: int, padding_side: str = "right") -> dict[str, torch.Tensor]:
    """Pad to the longest row; position ids count real tokens only, so left and right padding score the same."""
    width = max(len(row.input_ids) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        n = len(row.input_ids)
        cols = slice(width - n, width) if padding_side == "left" else slice(0, n)
        input_ids[b, cols] = torch.tensor(row.input_ids)
        attention_mask[b, cols] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


def token_scores(
    hidden: torch.Tensor, targets: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """NLL of ``targets`` and entropy of the predictive distribution, from the hidden states that predict them.

    ``hidden`` is ``(n, d)`` and ``head`` maps it to finite float32 logits; only ``chunk_size x vocab`` logits
    exist at once. With ``z = logits - max`` and ``s = sum(exp(z))``: ``nll = log s - z[target]`` and
    ``entropy = log s - sum(exp(z) * z) / s``, which needs three vocab-sized buffers and no log-softmax copy.
    """
    nll, entropy = [], []
    for start in range(0, targets.numel(), chunk_size):
        z = head(hidden[start : start + chunk_size])
        z = z.sub_(z.amax(dim=-1, keepdim=True))
        exp_z = z.exp()
        total = exp_z.sum(-1)
        log_total = total.log()
        nll.append(log_total - z.gather(-1, targets[start : start + chunk_size, None]).squeeze(-1))
        entropy.append(log_total - (exp_z * z).sum(-1) / total)  # not bmm: its CPU accumulation loses ~1e-4 here
    return torch.cat(nll), torch.cat(entropy)


def score_batch(model: PreTrainedModel, rows: Sequence[EncodedRow], options: ScoringOptions,
                pad_token_id: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Score one batch; return ``(nll, entropy)`` per row in ``rows`` order."""
    batch = {k: v.to(model.device) for k, v in collate(rows, pad_token_id, options.padding_side).items()}
    hidden = model.base_model(**batch).last_hidden_state
    width = batch["input_ids"].shape[1]
    # Logits at position p predict the token at p + 1: gather the states before each completion token.
    batch_index, positions = [], []
    for b, row in enumerate(rows):
        end = width if options.padding_side == "left" else len(row.input_ids)
        first = end - len(row.completion_ids)
        batch_index.append(torch.full((end - first,), b))
        positions.append(torch.arange(first - 1, end - 1))
    targets = torch.tensor([t for row in rows for t in row.completion_ids], device=model.device)
    states = hidden[torch.cat(batch_index).to(model.device), torch.cat(positions).to(model.device)]
    chunk_size = max(1, options.logits_chunk_elements // model.config.vocab_size)
    nll, entropy = token_scores(states, targets, lambda h: _head_logits(model, h), chunk_size)
    sizes = [len(row.completion_ids) for row in rows]
    return [(n.cpu().numpy(), e.cpu().numpy()) for n, e in zip(nll.split(sizes), entropy.split(sizes))]


def _check_scores(row: EncodedRow, nll: np.ndarray, entropy: np.ndarray, completion: str) -> dict[str, list]:
    record = {
        TEACHER_START: [s for s, _ in row.spans],
        TEACHER_END: [e for _, e in row.spans],
        TEACHER_NLL: nll.tolist(),
        TEACHER_ENTROPY: entropy.tolist(),
    }
    validate_teacher_scores(record, completion, row.index)
    return record


def score_rows(model: PreTrainedModel, rows: Sequence[EncodedRow], completions: Sequence[str], options: ScoringOptions,
               pad_token_id: int, progress: tqdm | None = None) -> list[dict[str, list]]:
    """Score rows in length-sorted batches; results come back in ``rows`` order, validated (finite, spans in text)."""
    results: list[dict[str, list] | None] = [None] * len(rows)
    with torch.inference_mode():
        for batch in plan_batches([len(r.input_ids) for r in rows], options.max_tokens_per_batch):
            scored = score_batch(model, [rows[i] for i in batch], options, pad_token_id)
            for i, (nll, entropy) in zip(batch, scored):
                results[i] = _check_scores(rows[i], nll, entropy, completions[i])
            if progress is not None:
                progress.update(sum(len(rows[i].completion_ids) for i in batch))
    return results  # type: ignore[return-value]


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
