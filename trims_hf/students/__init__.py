"""Masked-diffusion students: loading, the per-family spec, and aligned logits.

Five families: LLaDA (Llama blocks, no logit shift; LLaDA-8B and LLaDA 1.5), LLaDA-MoE (Qwen3-MoE blocks, no logit
shift), LLaDA 2.x (GLM-4-MoE blocks with a fused QKV projection, no logit shift, block diffusion), Dream (Qwen2 blocks,
logits shifted right by one; Dream, Dream-Coder, DiffuCoder) and any ``AutoModelForMaskedLM`` (e.g. ModernBERT). The
decoders run on transformers' own Llama / Qwen3-MoE / GLM-4-MoE / Qwen2 code made bidirectional, so no Hub remote code
is executed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, PreTrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

from .adapters import (
    AdapterError,
    adapter_folder,
    check_adapter_base,
    load_adapter,
    read_adapter,
)
from .base import StudentSpec, make_bidirectional, use_mdlm_loss
from .dream import dream_config_from_qwen2, qwen2_config_from_dream
from .layout import OriginalLayout, use_original_layout
from .llada import MODULE_NAMES as LLADA_MODULE_NAMES
from .llada import llada_config_from_llama, llama_config_from_llada
from .llada2 import BLOCK_SIZE as LLADA2_BLOCK_SIZE
from .llada2 import MODULE_NAMES as LLADA2_MODULE_NAMES
from .llada2 import LLaDA2ForCausalLM, glm4_moe_config_from_llada2, llada2_config_from_glm4_moe
from .llada_moe import fuse_expert_weights, llada_moe_config_from_qwen3_moe, qwen3_moe_config_from_llada_moe

_DECODER_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Attention only: peft maps any MLP projection name (even a regex matching only a dense layer's) onto the experts'
# fused 3-D parameters, whose adapter has no counterpart among the original code's per-expert modules.
_MOE_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
_LLADA2_LORA_TARGETS = ("query_key_value", "o_proj")  # the original's query_key_value and dense, for the same reason
BLOCK_MASK_ATTENTION = ("sdpa", "eager")
"""Attention implementations that apply an arbitrary [B, 1, Q, K] mask, as block diffusion needs (flash attention
takes padding masks only)."""

STUDENTS: dict[str, StudentSpec] = {
    "llada": StudentSpec(kind="llada", shift_logits=False, lora_target_modules=_DECODER_LORA_TARGETS, decoder=True,
                         native_model_types=("llada",), native_key="d_model", translate_config=llama_config_from_llada,
                         original_config=llada_config_from_llama, module_names=LLADA_MODULE_NAMES),
    "llada_moe": StudentSpec(kind="llada_moe", shift_logits=False, lora_target_modules=_MOE_LORA_TARGETS,
                             decoder=True, native_model_types=("llada", "lladamoe"), native_key="num_experts",
                             translate_config=qwen3_moe_config_from_llada_moe, fuse_state_dict=fuse_expert_weights,
                             original_config=llada_moe_config_from_qwen3_moe),
    "llada2": StudentSpec(kind="llada2", shift_logits=False, lora_target_modules=_LLADA2_LORA_TARGETS, decoder=True,
                          native_model_types=("llada2_moe", "llada21_moe", "llada2_moe_veomni"),
                          translate_config=glm4_moe_config_from_llada2,
                          module_names=LLADA2_MODULE_NAMES, fuse_state_dict=fuse_expert_weights,
                          original_config=llada2_config_from_glm4_moe, model_class=LLaDA2ForCausalLM,
                          block_size=LLADA2_BLOCK_SIZE),
    "dream": StudentSpec(kind="dream", shift_logits=True, lora_target_modules=_DECODER_LORA_TARGETS, decoder=True,
                         native_model_types=("dream",), translate_config=qwen2_config_from_dream,
                         original_config=dream_config_from_qwen2),
    "masked_lm": StudentSpec(kind="masked_lm", shift_logits=False, lora_target_modules="all-linear", decoder=False),
}


def _config_of(model: nn.Module) -> PreTrainedConfig:
    config = getattr(model, "config", None)
    if config is None and hasattr(model, "module"):  # DDP / DeepSpeed wrappers
        config = model.module.config
    if config is None:
        raise TypeError(f"{type(model).__name__} has no transformers config; it is not a student model.")
    return config


class StudentKindError(ValueError):
    """A config does not say which student family it is (a plain causal LM): the caller must name the kind."""

    def __init__(self, model_type: str) -> None:
        self.model_type = model_type
        super().__init__(
            f"Cannot tell which kind of student a '{model_type}' model is: pass kind='llada' (unshifted logits) or "
            f"kind='dream' (logits shifted by one) to use a causal LM as a masked diffusion student."
        )


class MaskTokenError(ValueError):
    """A student has no mask token id, or one outside its vocabulary."""


def _checked_mask_id(mask_token_id: int | None, vocab_size: int | None) -> int:
    if mask_token_id is None:
        raise MaskTokenError("no mask token id: none was given and neither the config nor the tokenizer has one")
    if vocab_size is not None and not 0 <= int(mask_token_id) < vocab_size:
        raise MaskTokenError(f"mask token id {mask_token_id} is outside the vocabulary ({vocab_size} tokens)")
    return int(mask_token_id)


def prepare_student(model: nn.Module, kind: str, mask_token_id: int | None = None) -> nn.Module:
    """Mark ``model`` as a student of ``kind``, make its attention bidirectional and, called on a
    :class:`trims_hf.TrimsDataCollator` batch, make it return the MDLM loss (so a plain ``transformers.Trainer``
    trains the same objective as :class:`trims_hf.MDLMTrainer`), in place.

    Use this on models you build yourself (e.g. a tiny ``LlamaForCausalLM`` in a test); models from
    :func:`load_student` are already prepared. The mask id defaults to the one on the model's config.
    """
    if kind not in STUDENTS:
        raise ValueError(f"Unknown student kind {kind!r}; choose one of {sorted(STUDENTS)}.")
    config = _config_of(model)
    mask_token_id = mask_token_id if mask_token_id is not None else getattr(config, "mask_token_id", None)
    config.mask_token_id = _checked_mask_id(mask_token_id, config.get_text_config().vocab_size)
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
    """The tokenizer's mask token id, adding ``token`` as the mask token (and an embedding row for it) when the
    tokenizer has none, as a causal LM such as SmolLM2 needs before :func:`prepare_student`; in place.

    The new row is transformers' default resize (mean of the existing embeddings), so the pretrained
    predictions are unchanged until training teaches the model what a masked position means.
    """
    if tokenizer.mask_token_id is None:
        tokenizer.add_special_tokens({"mask_token": token})
    if len(tokenizer) > _config_of(model).get_text_config().vocab_size:
        model.resize_token_embeddings(len(tokenizer))
    return int(tokenizer.mask_token_id)


def student_spec(model: nn.Module) -> StudentSpec:
    """The :class:`StudentSpec` of a prepared student (works through PEFT/DDP wrappers)."""
    kind = getattr(_config_of(model), "trims_student", None)
    if kind is None:
        raise ValueError(
            "This model is not marked as a masked-diffusion student. Load it with trims_hf.load_student(...) "
            "or call trims_hf.prepare_student(model, kind=...) first."
        )
    return STUDENTS[kind]


def mask_token_id(model: nn.Module) -> int:
    """The student's mask token id (stored on its config by :func:`prepare_student`)."""
    student_spec(model)
    return int(_config_of(model).mask_token_id)


def student_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
) -> torch.Tensor:
    """Run the student and return logits aligned so that ``[:, i]`` predicts token ``i``."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits
    return student_spec(model).align_logits(logits)


def detect_student_kind(config_dict: dict[str, Any]) -> str:
    """The student family of a ``config.json`` dict: a saved student's own mark, an original LLaDA / LLaDA-MoE / Dream
    checkpoint's config, or a masked LM; a causal LM needs the caller to say how it was made bidirectional."""
    if config_dict.get("trims_student"):
        return config_dict["trims_student"]
    for spec in STUDENTS.values():
        if spec.is_original(config_dict):
            return spec.kind
    model_type = str(config_dict.get("model_type", "")).lower()
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "masked_lm"
    raise StudentKindError(model_type)


def student_config(config_dict: dict[str, Any], kind: str) -> PreTrainedConfig:
    """The transformers config a student of ``kind`` with this ``config.json`` dict loads with (LLaDA / Dream
    originals translated), so checks that need only the config run before any weight is read."""
    spec = STUDENTS[kind]
    return spec.translate_config(config_dict) if spec.is_original(config_dict) else PreTrainedConfig.from_dict(config_dict)


def check_sequence_length(config_dict: dict[str, Any], kind: str, max_length: int) -> None:
    """Refuse sequences longer than the student's position embeddings, which it was never trained beyond."""
    positions = getattr(student_config(config_dict, kind).get_text_config(), "max_position_embeddings", None)
    if positions is not None and max_length > positions:
        raise ValueError(f"max_length={max_length}: more than the {positions} positions of the student "
                         f"(max_position_embeddings); set it to at most {positions}")


def student_mask_token_id(config_dict: dict[str, Any], kind: str, mask_token_id: int | None = None,
                          tokenizer: Any = None) -> int:
    """The mask id a student of ``kind`` with this ``config.json`` dict uses: ``mask_token_id``, else its config's,
    else ``tokenizer``'s; checked against the vocabulary. Needs no weights, so a missing id fails in seconds."""
    config = student_config(config_dict, kind)
    for candidate in (mask_token_id, getattr(config, "mask_token_id", None), getattr(tokenizer, "mask_token_id", None)):
        if candidate is not None:
            break
    return _checked_mask_id(candidate, getattr(config.get_text_config(), "vocab_size", None))


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
    ``PeftModel`` returned (:func:`~trims_hf.students.adapters.load_adapter`); one recorded as trained on another base
    fails before any weight is read, unless ``allow_base_mismatch``.
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
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False, **hub_kwargs)
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
        return load_adapter(model, adapter, token=token, allow_base_mismatch=True)  # the base was checked above
    return model


__all__ = [
    "STUDENTS",
    "AdapterError",
    "MaskTokenError",
    "StudentKindError",
    "StudentSpec",
    "add_mask_token",
    "check_sequence_length",
    "detect_student_kind",
    "load_adapter",
    "load_student",
    "make_bidirectional",
    "mask_token_id",
    "prepare_student",
    "student_config",
    "student_logits",
    "student_mask_token_id",
    "student_spec",
]
