"""Loading a student: :func:`load_student` (Hub or folder, original or native layout, an adapter on top) and
:func:`prepare_student` (a model built in code), both leaving a model a plain ``transformers.Trainer`` trains with the
MDLM loss; :func:`add_mask_token` for a causal LM without one."""

from __future__ import annotations

import logging
import re
import threading
import warnings
from typing import Any

from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, PreTrainedConfig

from .adapters import adapter_folder, check_adapter_base, load_adapter, read_adapter
from .base import make_bidirectional
from .layout import OriginalLayout, use_original_layout
from .registry import (
    BLOCK_MASK_ATTENTION,
    STUDENTS,
    MaskTokenError,
    checked_mask_id,
    config_of,
    detect_student_kind,
    student_mask_token_id,
)
from .trainer_hooks import use_mdlm_loss

CONFIG_READER = "transformers.configuration_utils"
"""The module that reads a config for ``AutoTokenizer`` and says the two things :func:`load_student_tokenizer` leaves
out: :data:`BARE_CONFIG_LINE` (logged) and :data:`RENAMED_ROPE_KEY` (a FutureWarning)."""
BARE_CONFIG_LINE = "You are using a model of type"
RENAMED_ROPE_KEY = r"`rope_scaling` is deprecated"


def load_student_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained(name_or_path, **kwargs)`` without remote code, and without two lines about an
    original config.

    ``AutoTokenizer`` reads the checkpoint's config only to choose the tokenizer class. An original config (LLaDA,
    Dream, LLaDA-MoE, LLaDA 2.x) names a model type transformers does not know, so it is read into a bare
    ``PreTrainedConfig``, which logs "You are using a model of type ... to instantiate a model of type ``" and, where
    the file has ``rope_scaling``, warns that the key is deprecated: neither is about the tokenizer, and the model is
    loaded through its translated config, which says neither. Those two are left out (the log line only from this
    call's thread; the warning filter is process-wide while the call runs, as ``warnings.catch_warnings`` is); every
    other line, and the tokenizer chosen, are ``AutoTokenizer``'s.
    """
    from transformers import AutoTokenizer

    if kwargs.pop("trust_remote_code", False):
        raise ValueError("load_student_tokenizer runs no remote code: trust_remote_code=True is refused.")
    caller = threading.get_ident()

    def keep(record: logging.LogRecord) -> bool:
        return not (record.thread == caller and record.getMessage().startswith(BARE_CONFIG_LINE))

    reader = logging.getLogger(CONFIG_READER)
    reader.addFilter(keep)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=RENAMED_ROPE_KEY, category=FutureWarning,
                                    module=re.escape(CONFIG_READER) + r"\Z")
            return AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False, **kwargs)
    finally:
        reader.removeFilter(keep)


def prepare_student(model: nn.Module, kind: str, mask_token_id: int | None = None) -> nn.Module:
    """Mark ``model`` as a student of ``kind``, make its attention bidirectional and, called on a
    :class:`trims_hf.TrimsDataCollator` batch, make it return the MDLM loss (so a plain ``transformers.Trainer``
    trains the same objective as :class:`trims_hf.MDLMTrainer`), in place.

    Use this on models you build yourself (e.g. a tiny ``LlamaForCausalLM`` in a test); models from
    :func:`load_student` are already prepared. The mask id defaults to the one on the model's config.
    """
    if kind not in STUDENTS:
        raise ValueError(f"Unknown student kind {kind!r}; choose one of {sorted(STUDENTS)}.")
    config = config_of(model)
    mask_token_id = mask_token_id if mask_token_id is not None else getattr(config, "mask_token_id", None)
    config.mask_token_id = checked_mask_id(mask_token_id, config.get_text_config().vocab_size)
    attention = getattr(config, "_attn_implementation", None)
    if STUDENTS[kind].block_size is not None and attention not in BLOCK_MASK_ATTENTION:
        raise ValueError(f"attn_implementation={attention!r}: a block-diffusion student ({kind}) trains and decodes under "
                         f"a block mask, which only {' and '.join(BLOCK_MASK_ATTENTION)} take")
    config.trims_student = kind
    if STUDENTS[kind].decoder:
        make_bidirectional(model)
    use_mdlm_loss(model, STUDENTS[kind])
    return model


def add_mask_token(model: nn.Module, tokenizer: Any, token: str = "<|mask|>") -> int:
    """The mask token id of ``model`` and ``tokenizer``, in place. A mask id the model's config holds already (a
    trained one, such as LLaDA's, whose tokenizer may declare no mask token) is kept, and named the tokenizer's mask
    token where the tokenizer has that id; otherwise ``token`` is added as the mask token, with an embedding row, as a
    causal LM such as SmolLM2 needs before :func:`prepare_student`, and its id set on the config, where
    :func:`prepare_student` reads it. A config and a tokenizer naming two different mask ids are refused.

    A new row is transformers' default resize (mean of the existing embeddings), so the pretrained
    predictions are unchanged until training teaches the model what a masked position means.
    """
    config = config_of(model)
    held = getattr(config, "mask_token_id", None)
    if held is not None:
        if tokenizer.mask_token_id is None and 0 <= held < len(tokenizer):
            tokenizer.mask_token = tokenizer.convert_ids_to_tokens(held)
        if tokenizer.mask_token_id not in (None, held):
            raise MaskTokenError(f"the model's config has mask_token_id {held}, its tokenizer's mask token "
                                 f"{tokenizer.mask_token!r} is id {tokenizer.mask_token_id}: pass a tokenizer and a "
                                 "model that agree")
        return int(held)
    if tokenizer.mask_token_id is None:
        tokenizer.add_special_tokens({"mask_token": token})
    if len(tokenizer) > config.get_text_config().vocab_size:
        model.resize_token_embeddings(len(tokenizer))
    config.mask_token_id = int(tokenizer.mask_token_id)
    return int(tokenizer.mask_token_id)


def _check_all_weights_loaded(name_or_path: str, info: dict[str, Any]) -> None:
    """Refuse a checkpoint whose weights do not all land in the model (transformers only warns and keeps the random
    init, e.g. a LLaDA saved by earlier trims_hf with corrupted norm names)."""
    missing, unexpected = sorted(info.get("missing_keys") or ()), sorted(info.get("unexpected_keys") or ())
    if missing or unexpected:
        raise ValueError(f"{name_or_path}: checkpoint weights do not match the model: missing {missing[:4]}"
                         f"{' ...' if len(missing) > 4 else ''}, unexpected {unexpected[:4]}"
                         f"{' ...' if len(unexpected) > 4 else ''}")


def load_student(
    name_or_path: str,
    kind: str | None = None,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    mask_token_id: int | None = None,
    adapter: str | None = None,
    allow_base_mismatch: bool = False,
    **from_pretrained_kwargs: Any,
) -> nn.Module:
    """Load a LLaDA, Dream or masked-LM student from the Hub or a folder, ready for training or decoding.

    LLaDA and Dream checkpoints load into transformers' native Llama/Qwen2 classes (weights renamed for LLaDA), so
    ``trust_remote_code`` is never needed; a student read from such an original checkpoint saves back in its layout
    (:mod:`trims_hf.students.layout`), and one saved natively reads back natively. ``kind`` is detected from the config
    (a plain causal LM such as Llama or Qwen2 needs it: :class:`StudentKindError`). The mask id comes from
    ``mask_token_id``, else the config, else the tokenizer (:func:`student_mask_token_id`), before any weight is read.
    Extra keyword arguments (``dtype``, ``device_map``, ``attn_implementation``...) go to ``from_pretrained``.

    ``adapter`` (a LoRA folder or Hub id, with the original or the native module names) is loaded on top and the
    ``PeftModel`` returned (:func:`~trims_hf.students.adapters.load_adapter`); one recorded as trained on a base of
    another name fails before any weight is read, one recorded with other base weights once they are read, unless
    ``allow_base_mismatch``.
    """
    hub_kwargs = {"revision": revision, "token": token}
    config_dict, _ = PreTrainedConfig.get_config_dict(name_or_path, **hub_kwargs)
    if adapter is not None:
        check_adapter_base(read_adapter(adapter_folder(adapter, token=token))[0], name_or_path, adapter,
                           allow_base_mismatch)
    spec = STUDENTS[kind] if kind is not None else STUDENTS[detect_student_kind(config_dict)]
    try:
        mask_token_id = student_mask_token_id(config_dict, spec.kind, mask_token_id)
    except MaskTokenError:  # none given or on the config: the tokenizer's (read only when needed)
        tokenizer = load_student_tokenizer(name_or_path, **hub_kwargs)
        mask_token_id = student_mask_token_id(config_dict, spec.kind, mask_token_id, tokenizer)
    if spec.decoder:
        native = spec.is_original(config_dict)
        model, info = (spec.model_class or AutoModelForCausalLM).from_pretrained(
            name_or_path, config=spec.translate_config(config_dict) if native else None,
            key_mapping=spec.key_mapping, output_loading_info=True, **hub_kwargs, **from_pretrained_kwargs,
        )
        _check_all_weights_loaded(name_or_path, info)
        if native:
            use_original_layout(model, OriginalLayout(config_dict, name_or_path, revision, token))
    else:
        model = AutoModelForMaskedLM.from_pretrained(name_or_path, **hub_kwargs, **from_pretrained_kwargs)
    model = prepare_student(model, spec.kind, mask_token_id)
    if adapter is not None:
        return load_adapter(model, adapter, token=token, allow_base_mismatch=allow_base_mismatch)
    return model
