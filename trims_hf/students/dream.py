"""Dream as a native transformers Qwen2 with bidirectional attention (no Hub remote code).

Dream-v0 checkpoints already use Qwen2's parameter names; only the config class and the attention
direction differ. Its logits are shifted: the prediction for token ``i`` sits at position ``i - 1``.
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen2Config

from .translation import overlay

DEFAULT_MASK_TOKEN_ID = 151666

_COPIED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "hidden_act",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
)


def qwen2_config_from_dream(dream: dict[str, Any]) -> Qwen2Config:
    """Translate a Dream ``config.json`` dict into the equivalent ``Qwen2Config``."""
    if dream.get("use_sliding_window"):
        raise ValueError("Dream config with use_sliding_window=True is not supported by the native Qwen2 port.")
    if dream.get("rope_scaling"):
        raise ValueError(f"Dream config rope_scaling={dream['rope_scaling']!r} is not supported.")
    fields = {key: dream[key] for key in _COPIED_FIELDS if key in dream}
    return Qwen2Config(
        **fields,
        rope_parameters={"rope_type": "default", "rope_theta": dream.get("rope_theta", 10000.0)},
        mask_token_id=dream.get("mask_token_id", DEFAULT_MASK_TOKEN_ID),
    )


def dream_config_from_qwen2(qwen2: Qwen2Config, original: dict[str, Any]) -> dict[str, Any]:
    """The Dream ``config.json`` dict of ``qwen2``: ``original`` (the base's, with its ``auto_map``) with the fields
    :func:`qwen2_config_from_dream` reads set from ``qwen2``; ``rope_theta`` stays top level, where Dream's own
    config class reads it (without it, that class falls back to 10,000)."""
    rope = qwen2.rope_parameters or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_parameters={rope!r}: Dream's original code has no RoPE scaling; save with "
                         "layout='native'")
    fields = {key: getattr(qwen2, key) for key in _COPIED_FIELDS}
    return overlay(original, {**fields, "rope_theta": rope.get("rope_theta", original.get("rope_theta")),
                              "mask_token_id": qwen2.mask_token_id})
