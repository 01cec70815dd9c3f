"""Masked-diffusion students: loading, the per-family spec, and aligned logits.

Five families: LLaDA (Llama blocks, no logit shift; LLaDA-8B and LLaDA 1.5), LLaDA-MoE (Qwen3-MoE blocks, no logit
shift), LLaDA 2.x (GLM-4-MoE blocks with a fused QKV projection, no logit shift, block diffusion), Dream (Qwen2 blocks,
logits shifted right by one; Dream, Dream-Coder, DiffuCoder) and any ``AutoModelForMaskedLM`` (e.g. ModernBERT). The
decoders run on transformers' own Llama / Qwen3-MoE / GLM-4-MoE / Qwen2 code made bidirectional, so no Hub remote code
is executed.
"""

from .adapters import AdapterError, get_lora_model, load_adapter
from .base import StudentSpec, compile_blocks, has_compiled_blocks, make_bidirectional
from .loading import add_mask_token, load_student, load_student_tokenizer, prepare_student
from .registry import (
    STUDENTS,
    MaskTokenError,
    StudentKindError,
    check_sequence_length,
    detect_student_kind,
    mask_token_id,
    student_config,
    student_logits,
    student_mask_token_id,
    student_positions,
    student_spec,
)

__all__ = [
    "STUDENTS",
    "AdapterError",
    "MaskTokenError",
    "StudentKindError",
    "StudentSpec",
    "add_mask_token",
    "check_sequence_length",
    "student_positions",
    "compile_blocks",
    "has_compiled_blocks",
    "detect_student_kind",
    "get_lora_model",
    "load_adapter",
    "load_student",
    "load_student_tokenizer",
    "make_bidirectional",
    "mask_token_id",
    "prepare_student",
    "student_config",
    "student_logits",
    "student_mask_token_id",
    "student_spec",
]
