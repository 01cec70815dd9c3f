"""The student families and what every component reads off a student: :data:`STUDENTS` (one
:class:`~trims_hf.students.base.StudentSpec` per family), the spec and mask id of a prepared model, its aligned
logits, and a ``config.json`` dict's family, config, length limit and mask id (checked before any weight is read)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

from .base import StudentSpec
from .dream import dream_config_from_qwen2, qwen2_config_from_dream
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


def config_of(model: nn.Module) -> PreTrainedConfig:
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


def checked_mask_id(mask_token_id: int | None, vocab_size: int | None) -> int:
    if mask_token_id is None:
        raise MaskTokenError("no mask token id: none was given and neither the config nor the tokenizer has one")
    if vocab_size is not None and not 0 <= int(mask_token_id) < vocab_size:
        raise MaskTokenError(f"mask token id {mask_token_id} is outside the vocabulary ({vocab_size} tokens)")
    return int(mask_token_id)


def student_spec(model: nn.Module) -> StudentSpec:
    """The :class:`StudentSpec` of a prepared student (works through PEFT/DDP wrappers)."""
    kind = getattr(config_of(model), "trims_student", None)
    if kind is None:
        raise ValueError(
            "This model is not marked as a masked-diffusion student. Load it with trims_hf.load_student(...) "
            "or call trims_hf.prepare_student(model, kind=...) first."
        )
    return STUDENTS[kind]


def mask_token_id(model: nn.Module) -> int:
    """The student's mask token id (stored on its config by :func:`prepare_student`)."""
    student_spec(model)
    return int(config_of(model).mask_token_id)


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


def student_positions(config_dict: dict[str, Any], kind: str) -> int | None:
    """The positions a student of ``kind`` with this ``config.json`` dict was trained on (``max_position_embeddings``),
    or None where its config names none."""
    return _positions(student_config(config_dict, kind))


def _positions(config: PreTrainedConfig) -> int | None:
    return getattr(config.get_text_config(), "max_position_embeddings", None)


def model_positions(model: nn.Module) -> int | None:
    """The positions a loaded student was trained on (``max_position_embeddings``), or None where its config names
    none."""
    return _positions(config_of(model))


def check_positions(length: int, positions: int | None, what: str | None = None) -> None:
    """Refuse sequences longer than the student's position embeddings, which it was never trained beyond (a rotary
    student runs there without complaint, on positions it never saw); ``what`` names the length (``max_length=N``)."""
    if positions is not None and length > positions:
        raise ValueError(f"{what or f'max_length={length}'}: more than the {positions} positions of the student "
                         f"(max_position_embeddings); set it to at most {positions}")


def check_batch_length(input_ids: torch.Tensor, positions: int | None) -> None:
    """:func:`check_positions` for a training batch (``[B, L]`` ids) about to run through a student of ``positions``
    positions (:func:`model_positions` of the model itself: a DeepSpeed engine's ``config`` is its own)."""
    length = input_ids.shape[1]
    check_positions(length, positions, f"a batch of {length} tokens (the collator's max_length, or its longest row "
                                       "with padding='longest')")


def check_sequence_length(config_dict: dict[str, Any], kind: str, max_length: int) -> None:
    """:func:`check_positions` for a student's ``config.json`` dict (no weights)."""
    check_positions(max_length, student_positions(config_dict, kind))


def student_mask_token_id(config_dict: dict[str, Any], kind: str, mask_token_id: int | None = None,
                          tokenizer: Any = None) -> int:
    """The mask id a student of ``kind`` with this ``config.json`` dict uses: ``mask_token_id``, else its config's,
    else ``tokenizer``'s; checked against the vocabulary. Needs no weights, so a missing id fails in seconds."""
    config = student_config(config_dict, kind)
    for candidate in (mask_token_id, getattr(config, "mask_token_id", None), getattr(tokenizer, "mask_token_id", None)):
        if candidate is not None:
            break
    return checked_mask_id(candidate, getattr(config.get_text_config(), "vocab_size", None))
