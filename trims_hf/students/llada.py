"""LLaDA as a native transformers Llama with bidirectional attention (no Hub remote code).

LLaDA-8B's blocks are Llama blocks with different parameter names (REFERENCE.md §2, checked to give
identical logits). Translating the config and renaming checkpoint keys at load time lets the stock
``LlamaForCausalLM`` run it on transformers 5.x, with its SDPA/flash kernels, LoRA and ZeRO support.
"""

from __future__ import annotations

from typing import Any

from transformers import LlamaConfig

from .names import ModuleNames
from .translation import default_rope, overlay, special_token_ids

DEFAULT_MASK_TOKEN_ID = 126336

# Original LLaDA module path -> native Llama path (REFERENCE.md §2): the one table behind every rename.
MODULE_NAMES = ModuleNames((
    ("model.transformer.wte", "model.embed_tokens"),
    ("model.transformer.blocks.{i}.attn_norm", "model.layers.{i}.input_layernorm"),
    ("model.transformer.blocks.{i}.ff_norm", "model.layers.{i}.post_attention_layernorm"),
    ("model.transformer.blocks.{i}.q_proj", "model.layers.{i}.self_attn.q_proj"),
    ("model.transformer.blocks.{i}.k_proj", "model.layers.{i}.self_attn.k_proj"),
    ("model.transformer.blocks.{i}.v_proj", "model.layers.{i}.self_attn.v_proj"),
    ("model.transformer.blocks.{i}.attn_out", "model.layers.{i}.self_attn.o_proj"),
    ("model.transformer.blocks.{i}.ff_proj", "model.layers.{i}.mlp.gate_proj"),
    ("model.transformer.blocks.{i}.up_proj", "model.layers.{i}.mlp.up_proj"),
    ("model.transformer.blocks.{i}.ff_out", "model.layers.{i}.mlp.down_proj"),
    ("model.transformer.ln_f", "model.norm"),
    ("model.transformer.ff_out", "lm_head"),  # the LM head: same leaf name as a block's MLP output
))

# Features of the LLaDA code base that a Llama block cannot express.
_REQUIRED = {
    "block_type": "llama",
    "layer_norm_type": "rms",
    "activation_type": "silu",
    "alibi": False,
    "rope": True,
    "include_bias": False,
    "bias_for_layer_norm": False,
    "input_emb_norm": False,
    "attention_layer_norm": False,
    "scale_logits": False,
}


def llama_config_from_llada(llada: dict[str, Any]) -> LlamaConfig:
    """Translate a LLaDA ``config.json`` dict into the equivalent ``LlamaConfig``."""
    for key, expected in _REQUIRED.items():
        if key in llada and llada[key] != expected:
            raise ValueError(
                f"LLaDA config field {key}={llada[key]!r} is not supported by the native Llama port "
                f"(expected {expected!r})."
            )
    n_heads = llada["n_heads"]
    return LlamaConfig(
        vocab_size=llada.get("embedding_size") or llada["vocab_size"],
        hidden_size=llada["d_model"],
        intermediate_size=llada["mlp_hidden_size"],
        num_hidden_layers=llada["n_layers"],
        num_attention_heads=n_heads,
        num_key_value_heads=llada.get("n_kv_heads") or n_heads,
        max_position_embeddings=llada.get("max_sequence_length", 4096),
        rms_norm_eps=llada.get("rms_norm_eps", 1e-5),
        rope_parameters={"rope_type": "default", "rope_theta": llada.get("rope_theta", 10000.0)},
        attention_bias=bool(llada.get("include_qkv_bias", False)),
        tie_word_embeddings=bool(llada.get("weight_tying", False)),
        **special_token_ids(llada, DEFAULT_MASK_TOKEN_ID),
    )


def llada_config_from_llama(llama: LlamaConfig, original: dict[str, Any]) -> dict[str, Any]:
    """The LLaDA ``config.json`` dict of ``llama``: ``original`` (the base's, with its ``auto_map`` and every field
    the Llama port does not use) with the fields :func:`llama_config_from_llada` reads set from ``llama``."""
    rope = default_rope(llama, "LLaDA")
    return overlay(original, {
        "embedding_size": llama.vocab_size,
        "vocab_size": min(int(original.get("vocab_size") or llama.vocab_size), llama.vocab_size),
        "d_model": llama.hidden_size,
        "mlp_hidden_size": llama.intermediate_size,
        "n_layers": llama.num_hidden_layers,
        "n_heads": llama.num_attention_heads,
        "n_kv_heads": llama.num_key_value_heads,
        "max_sequence_length": llama.max_position_embeddings,
        "rms_norm_eps": llama.rms_norm_eps,
        "rope_theta": rope.get("rope_theta", original.get("rope_theta")),
        "include_qkv_bias": bool(llama.attention_bias),
        "weight_tying": bool(llama.tie_word_embeddings),
        "pad_token_id": llama.pad_token_id,
        "eos_token_id": llama.eos_token_id,
        "bos_token_id": llama.bos_token_id,
        "mask_token_id": llama.mask_token_id,
    })
