"""LLaDA-MoE as a native transformers Qwen3-MoE with bidirectional attention (no Hub remote code).

inclusionAI's ``modeling_lladamoe.py`` (LLaDA-MoE-7B-A1B; dLLM trains the same file) is, block for block, transformers'
Qwen3-MoE: pre-norm layers, separate q/k/v/o projections, RMSNorm ``q_norm`` / ``k_norm`` over each head before
full RoPE, and a sparse MLP whose router is a softmax over ``num_experts`` in float32, top-``num_experts_per_tok``
weights used as they are (the original hard-codes ``norm_topk_prob = False``, whatever its config says), experts
``down(silu(gate(x)) * up(x))``; layers whose ``moe_layer_freq`` entry is 0 have one dense MLP. The parameter names
are Qwen3-MoE's too (transformers fuses the per-expert weights at load and splits them again when saving in the
original format), so only the config is translated. Features of the original code that Qwen3-MoE cannot express
(shared experts, an expert bias, QKV clipping, partial RoPE, RoPE scaling, no q/k norm) are refused at load.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from transformers import Qwen3MoeConfig

from .translation import default_rope, overlay, special_token_ids

DEFAULT_MASK_TOKEN_ID = 156895
"""``<|mask|>`` of LLaDA-MoE's tokenizer: the model card's ``generate(mask_id=156895)`` and dInfer's tests."""

_UNSUPPORTED = {
    "shared_expert_intermediate_size": "a shared expert",
    "moe_router_enable_expert_bias": "an expert bias in the router",
    "clip_qkv": "QKV clipping",
    "rope_scaling": "RoPE scaling",
}


def _moe_layers(original: dict[str, Any]) -> list[bool]:
    """Which layers have the sparse MLP (``moe_layer_freq[i] != 0``, as the original decoder layer decides)."""
    layers = int(original["num_hidden_layers"])
    frequency = original.get("moe_layer_freq") or [1] * layers
    if len(frequency) != layers:
        raise ValueError(f"LLaDA-MoE config: moe_layer_freq has {len(frequency)} entries for {layers} layers")
    return [value != 0 for value in frequency]


def qwen3_moe_config_from_llada_moe(original: dict[str, Any]) -> Qwen3MoeConfig:
    """Translate a LLaDA-MoE ``config.json`` dict into the equivalent ``Qwen3MoeConfig``."""
    for key, feature in _UNSUPPORTED.items():
        if original.get(key):
            raise ValueError(f"LLaDA-MoE config field {key}={original[key]!r} ({feature}) is not supported by the "
                             "native Qwen3-MoE port")
    if not original.get("qk_layernorm"):
        raise ValueError("LLaDA-MoE config field qk_layernorm is off: the native Qwen3-MoE port always normalises q and k")
    if original.get("partial_rotary_factor", 1) != 1:
        raise ValueError(f"LLaDA-MoE config field partial_rotary_factor={original['partial_rotary_factor']!r}: the "
                         "native Qwen3-MoE port rotates every dimension (1)")
    moe = _moe_layers(original)
    heads = original["num_attention_heads"]
    return Qwen3MoeConfig(
        vocab_size=original["vocab_size"],
        hidden_size=original["hidden_size"],
        intermediate_size=original.get("dense_intermediate_size"),
        moe_intermediate_size=original["expert_intermediate_size"],
        num_hidden_layers=original["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=original.get("num_key_value_heads") or heads,
        head_dim=original["hidden_size"] // heads,
        hidden_act=original.get("hidden_act", "silu"),
        max_position_embeddings=original.get("max_position_embeddings", 4096),
        rms_norm_eps=original.get("rms_norm_eps", 1e-5),
        rope_parameters={"rope_type": "default", "rope_theta": original["rope_theta"]},
        attention_bias=bool(original.get("attention_bias", False)),
        tie_word_embeddings=bool(original.get("tie_word_embeddings", False)),
        num_experts=original["num_experts"],
        num_experts_per_tok=original["num_experts_per_tok"],
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[i for i, sparse in enumerate(moe) if not sparse],
        use_sliding_window=False,
        **special_token_ids(original, DEFAULT_MASK_TOKEN_ID),
    )


def llada_moe_config_from_qwen3_moe(qwen: Qwen3MoeConfig, original: dict[str, Any]) -> dict[str, Any]:
    """The LLaDA-MoE ``config.json`` dict of ``qwen``: ``original`` (the base's, with its ``auto_map`` and the fields
    the port does not read) with the fields :func:`qwen3_moe_config_from_llada_moe` reads set from ``qwen``."""
    rope = default_rope(qwen, "LLaDA-MoE")
    dense = set(qwen.mlp_only_layers)
    mask = qwen.mask_token_id
    return overlay(original, {
        "vocab_size": qwen.vocab_size,
        "hidden_size": qwen.hidden_size,
        "dense_intermediate_size": qwen.intermediate_size,
        "expert_intermediate_size": qwen.moe_intermediate_size,
        "num_hidden_layers": qwen.num_hidden_layers,
        "num_attention_heads": qwen.num_attention_heads,
        "num_key_value_heads": qwen.num_key_value_heads,
        "hidden_act": qwen.hidden_act,
        "max_position_embeddings": qwen.max_position_embeddings,
        "rms_norm_eps": qwen.rms_norm_eps,
        "rope_theta": rope.get("rope_theta", original.get("rope_theta")),
        "attention_bias": bool(qwen.attention_bias),
        "tie_word_embeddings": bool(qwen.tie_word_embeddings),
        "num_experts": qwen.num_experts,
        "num_experts_per_tok": qwen.num_experts_per_tok,
        "moe_layer_freq": [0 if i in dense else 1 for i in range(qwen.num_hidden_layers)],
        "pad_token_id": qwen.pad_token_id,
        "bos_token_id": qwen.bos_token_id,
        "eos_token_id": qwen.eos_token_id,
        # The Hub config names no mask id (the model card passes it to generate): written only when it says something.
        "mask_token_id": mask if "mask_token_id" in original or mask != DEFAULT_MASK_TOKEN_ID else None,
    })


_EXPERT = re.compile(r"^(?P<layer>.*\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def fuse_expert_weights(state_dict: dict[str, Any], prefix: str) -> None:
    """Per-expert tensors of the original layout (``mlp.experts.E.{gate,up,down}_proj.weight``) under ``prefix`` stacked,
    in place, into the native ``mlp.experts.gate_up_proj`` ([experts, 2 x intermediate, hidden]: gate rows, then up)
    and ``mlp.experts.down_proj``, as transformers' Qwen3-MoE weight converter does at ``from_pretrained``; a
    ``load_state_dict`` of an original-layout checkpoint (the Trainer's resume) needs it too."""
    found: dict[str, dict[str, dict[int, Any]]] = {}
    for key in [key for key in state_dict if key.startswith(prefix)]:
        match = _EXPERT.match(key)
        if match:
            found.setdefault(match["layer"], {}).setdefault(match["proj"], {})[int(match["expert"])] = state_dict.pop(key)
    for layer, projections in found.items():
        stacked = {proj: torch.stack([tensors[e] for e in sorted(tensors)]) for proj, tensors in projections.items()}
        state_dict[f"{layer}.gate_up_proj"] = torch.cat([stacked["gate_proj"], stacked["up_proj"]], dim=1)
        state_dict[f"{layer}.down_proj"] = stacked["down_proj"]
