"""The autoregressive teacher as the scorer uses it: loading, row encoding with the shared prompt renderer,
and one teacher-forcing forward per batch through the chunked head of :func:`trims_hf.data.scoring.token_scores`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..errors import InputError
from ..prompts import prompt_token_ids
from ..settings import DEFAULT_TEACHER, ScoringOptions
from .schema import (
    COMPLETION,
    PROMPT,
    TEACHER_END,
    TEACHER_ENTROPY,
    TEACHER_LIST_COLUMNS,
    TEACHER_NLL,
    TEACHER_START,
    SchemaError,
    disjoint_spans,
    split_prompt_completion,
    validate_teacher_scores,
)
from .scoring import EncodedRow, collate, plan_batches, token_scores


def _pretrained_args(name_or_path: str, gguf_file: str | None, revision: str | None) -> tuple[str, dict[str, Any]]:
    """``from_pretrained`` arguments; a path to a ``.gguf`` file becomes its folder + ``gguf_file``."""
    if gguf_file is None and str(name_or_path).endswith(".gguf") and Path(name_or_path).is_file():
        name_or_path, gguf_file = str(Path(name_or_path).parent), Path(name_or_path).name
    return str(name_or_path), {"revision": revision, "gguf_file": gguf_file}


def check_causal_teacher(config: PretrainedConfig, name_or_path: str) -> None:
    """A teacher predicts each token from the tokens before it. A trims student (``trims_student`` in its config) or
    any model whose config says ``is_causal: false`` attends both ways, so it would see the very token it scores
    and its NLL would measure nothing; refused by name before any row is scored."""
    kind = getattr(config, "trims_student", None)
    if kind or False in (getattr(config, "is_causal", True), getattr(config.get_text_config(), "is_causal", True)):
        what = f"a {kind} student of trims_hf" if kind else "its config says is_causal: false"
        raise InputError(f"teacher {name_or_path}: {what}, so it attends to the tokens it scores; score with a causal "
                         "language model (an autoregressive teacher).")


def load_teacher_tokenizer(
    name_or_path: str = DEFAULT_TEACHER, gguf_file: str | None = None, revision: str | None = None
) -> tuple[PreTrainedTokenizerBase, PretrainedConfig]:
    """The teacher's tokenizer and config without its weights: enough to encode and check every row (and the
    context length) before the slow model load, so a bad row costs seconds, not a model load."""
    name_or_path, kwargs = _pretrained_args(name_or_path, gguf_file, revision)
    return AutoTokenizer.from_pretrained(name_or_path, **kwargs), AutoConfig.from_pretrained(name_or_path, **kwargs)


def load_teacher(
    name_or_path: str = DEFAULT_TEACHER,
    gguf_file: str | None = None,
    revision: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    *,
    loaded: tuple[PreTrainedTokenizerBase, PretrainedConfig] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM teacher and its tokenizer from a Hub id, a local folder, or a GGUF file.

    A path to a ``.gguf`` file may be given directly. bf16 on GPU, float32 on CPU unless ``dtype`` says otherwise.
    ``loaded``: what :func:`load_teacher_tokenizer` returned for the same teacher, so that neither is read again (a
    GGUF file's metadata, its whole vocabulary, takes seconds to parse on each read: SmolLM2's about 10).
    """
    name_or_path, kwargs = _pretrained_args(name_or_path, gguf_file, revision)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    tokenizer, config = loaded or (None, AutoConfig.from_pretrained(name_or_path, **kwargs))
    check_causal_teacher(config, name_or_path)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, config=config, dtype=dtype, **kwargs).to(device).eval()
    check_chunked_head(model)
    return model, tokenizer


def drop_gguf_marks(model: PreTrainedModel) -> PreTrainedModel:
    """Make a model loaded from a GGUF file trainable and savable as a plain checkpoint, in place.

    transformers dequantizes GGUF weights into ordinary float tensors at load, yet keeps the model marked as
    quantized, and the Trainer refuses to fine-tune a quantized model; the marks are all that is removed.
    """
    if getattr(getattr(model, "hf_quantizer", None), "quantization_config", None) is None or \
            str(model.hf_quantizer.quantization_config.quant_method.value) != "gguf":
        return model
    model.hf_quantizer, model.is_quantized = None, False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def teacher_identity(name_or_path: str, gguf_file: str | None = None, loaded: bool = False) -> dict[str, str | None]:
    """How a dataset card names the teacher: its Hub id, or a local model's own name (a GGUF file's stem, a
    folder's name), never this machine's absolute path, and where it came from."""
    path = Path(name_or_path).expanduser()
    if gguf_file is None and path.suffix == ".gguf" and path.is_file():
        path, gguf_file = path.parent, path.name
    if path.exists():
        name = Path(gguf_file).stem if gguf_file else path.resolve().name
        return {"teacher": name, "teacher_source": "local GGUF file" if gguf_file else "local folder",
                "teacher_gguf_file": gguf_file}
    source = "model given in-process" if loaded else "Hugging Face Hub"
    return {"teacher": str(name_or_path), "teacher_source": source, "teacher_gguf_file": gguf_file}


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


def context_length(config: PretrainedConfig, max_length: int | None = None) -> int:
    """The explicit ``max_length`` or the teacher's positions (:func:`position_limit`)."""
    length = max_length or position_limit(config)
    if not length:
        raise ValueError("The teacher config has no max_position_embeddings; pass max_length.")
    return int(length)


def position_limit(config: PretrainedConfig | None) -> int | None:
    """How many positions the teacher tells apart: ``max_position_embeddings`` of its text config, or what a RoPE
    scaling that records its original length extends it to (``original_max_position_embeddings`` x ``factor``: YaRN,
    LongRoPE, Llama 3); a scaling without one (linear) already counts in ``max_position_embeddings``. None when the
    config says neither."""
    if config is None:
        return None
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    positions = getattr(config, "max_position_embeddings", None) or 0
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    per_layer_type = [rope] if "rope_type" in rope or "factor" in rope else [v for v in rope.values() if isinstance(v, dict)]
    for parameters in per_layer_type:
        if parameters.get("original_max_position_embeddings") and parameters.get("factor"):
            positions = max(positions, int(parameters["original_max_position_embeddings"] * parameters["factor"]))
    return int(positions) or None


def encode_row(row: dict, index: int, tokenizer: PreTrainedTokenizerBase, options: ScoringOptions, max_length: int,
               positions: int | None = None) -> EncodedRow:
    """Tokenise one row; the completion separately, with character offsets, so spans index the completion text.

    The prompt must give at least one token: the teacher predicts the first completion token from the last
    prompt position, and without one there is nothing to predict it from. A row past the teacher's ``positions``
    (:func:`position_limit`; a ``max_length`` above them is allowed for the rows within them) is refused: a teacher
    with learned positions would fail on it, a RoPE one would score it silently out of distribution.
    """
    prompt, completion = split_prompt_completion(row, index)
    try:
        prompt_ids = prompt_token_ids(tokenizer, prompt, options)
    except ValueError as error:
        raise SchemaError(f"row {index}: field '{PROMPT}': {error}") from None
    if not prompt_ids:
        raise SchemaError(f"row {index}: field '{PROMPT}' renders to no teacher tokens, so nothing predicts the first "
                          f"completion token; give a prompt, or a prompt_format that adds one (chat_template, plain with a BOS).")
    encoded = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)
    completion_ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    if not completion_ids:
        raise SchemaError(f"row {index}: field '{COMPLETION}' has no teacher tokens.")
    room = max_length - len(prompt_ids)
    if room < 1:  # no truncation of the completion can make it fit
        raise SchemaError(f"row {index}: field '{PROMPT}' alone is {len(prompt_ids)} teacher tokens, leaving none of the "
                          f"context {max_length} to the completion; pass a larger teacher_max_length, or drop the row.")
    truncated = len(completion_ids) > room
    if truncated and not options.truncate:
        raise SchemaError(
            f"row {index}: field '{COMPLETION}' is too long for the teacher: {len(prompt_ids)} prompt + "
            f"{len(completion_ids)} completion tokens > context {max_length} (pass a larger teacher_max_length"
            + (")." if options.truncate else ", or truncate=True).")
        )
    completion_ids, offsets = completion_ids[:room], offsets[:room]
    if positions is not None and len(prompt_ids) + len(completion_ids) > positions:
        raise SchemaError(f"row {index}: {len(prompt_ids) + len(completion_ids)} teacher tokens ({len(prompt_ids)} prompt "
                          f"+ {len(completion_ids)} completion), past the {positions} positions the teacher's config "
                          f"gives (its max_position_embeddings and RoPE scaling); pass a teacher_max_length of at most "
                          f"{positions} (truncate=True cuts the completion to it), or drop the row.")
    return EncodedRow(index, tuple(prompt_ids) + tuple(completion_ids), len(prompt_ids), disjoint_spans(offsets), truncated)


def encode_dataset(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, options: ScoringOptions, max_length: int,
    positions: int | None = None,
) -> list[EncodedRow]:
    """Tokenise and validate every row before any scoring, so bad input fails before anything is written."""
    check_scorable(dataset)
    return [encode_row(row, index, tokenizer, options, max_length, positions) for index, row in enumerate(dataset)]


def check_scorable(dataset: Dataset) -> None:
    """A data set with rows and without the scorer's columns (old scores would clash with the new ones when they are
    merged, after the whole run); needs no tokenizer, so it fails before one loads."""
    if len(dataset) == 0:
        raise SchemaError("the data set has no rows, hence no completion tokens to score.")
    if scored := [name for name in TEACHER_LIST_COLUMNS if name in dataset.column_names]:
        raise SchemaError(f"the data set already has the scored column(s) {', '.join(scored)}: it was scored already; "
                          "pass the unscored rows (or drop those columns to score it again).")


def score_batch(model: PreTrainedModel, rows: Sequence[EncodedRow], options: ScoringOptions,
                pad_token_id: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Score one batch; return ``(nll, entropy)`` per row in ``rows`` order."""
    if any(row.prompt_length < 1 for row in rows):  # position prompt_length - 1 would wrap to the row's last token
        raise ValueError("Every row needs at least one prompt token before its completion (see encode_row).")
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
