"""LLaDA as a native transformers Llama with bidirectional attention (no Hub remote code).

LLaDA-8B's blocks are Llama blocks with different parameter names (REFERENCE.md §2, checked to give
identical logits). Translating the config and renaming checkpoint keys at load time lets the stock
``LlamaForCausalLM`` run it on transformers 5.x, with its SDPA/flash kernels, LoRA and ZeRO support.
"""

from __future__ import annotations

from typing import Any

from transformers import LlamaConfig

DEFAULT_MASK_TOKEN_ID = 126336

# Checkpoint name (after the leading "model.") -> Llama name. Applied by from_pretrained(key_mapping=...).
KEY_MAPPING = {
    r"model\.transformer\.ff_out\.": "lm_head.",
    r"transformer\.wte\.": "embed_tokens.",
    r"transformer\.ln_f\.": "norm.",
    r"transformer\.blocks\.(\d+)\.attn_norm\.": r"layers.\1.input_layernorm.",
    r"transformer\.blocks\.(\d+)\.ff_norm\.": r"layers.\1.post_attention_layernorm.",
    r"transformer\.blocks\.(\d+)\.q_proj\.": r"layers.\1.self_attn.q_proj.",
    r"transformer\.blocks\.(\d+)\.k_proj\.": r"layers.\1.self_attn.k_proj.",
    r"transformer\.blocks\.(\d+)\.v_proj\.": r"layers.\1.self_attn.v_proj.",
    r"transformer\.blocks\.(\d+)\.attn_out\.": r"layers.\1.self_attn.o_proj.",
    r"transformer\.blocks\.(\d+)\.ff_proj\.": r"layers.\1.mlp.gate_proj.",
    r"transformer\.blocks\.(\d+)\.up_proj\.": r"layers.\1.mlp.up_proj.",
    r"transformer\.blocks\.(\d+)\.ff_out\.": r"layers.\1.mlp.down_proj.",
}

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
        pad_token_id=llada.get("pad_token_id"),
        eos_token_id=llada.get("eos_token_id"),
        bos_token_id=llada.get("bos_token_id"),
        mask_token_id=llada.get("mask_token_id", DEFAULT_MASK_TOKEN_ID),
    )
