"""Dream as a native transformers Qwen2 with bidirectional attention (no Hub remote code).

Dream-v0 checkpoints already use Qwen2's parameter names; only the config class and the attention
direction differ. Its logits are shifted: the prediction for token ``i`` sits at position ``i - 1``.
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen2Config

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
