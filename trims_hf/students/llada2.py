"""LLaDA 2.0 / 2.1 (``LLaDA2MoeModelLM``) as transformers' GLM-4-MoE blocks with a fused QKV projection (no Hub code).

inclusionAI's ``modeling_llada2_moe.py`` (as dLLM ships it, ZHZisZZ/dllm ``dllm/pipelines/llada2/models`` at
ca176752, and dFactory ``models/llada2_moe``) is, block for block, transformers' GLM-4-MoE: pre-norm layers, RMSNorm
``q_norm`` / ``k_norm`` over each head, RoPE on the first ``partial_rotary_factor`` of each head (half-split), the
first ``first_k_dense_replace`` layers dense, the others a sparse MLP with a sigmoid router whose experts are chosen
on the scores plus a (frozen) expert bias, group-limited (top-2 sum per group, best ``topk_group`` of ``n_group``),
weighted by the bias-free scores renormalised over the top-k and times ``routed_scaling_factor``, plus one shared
expert. Only the attention's input projection differs: one ``query_key_value`` linear (q heads, then k, then v), which
:class:`LLaDA2Attention` keeps fused so LoRA on it is the original module's (an adapter exports to the original names
with no reshaping). The parameter names are translated by one table; the per-expert weights are fused at load and
split on save by transformers' own converter (GLM-4-MoE's, as for LLaDA-MoE). Features the port cannot express are
refused at load, naming the field.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
from transformers.models.glm4_moe.modeling_glm4_moe import (
    ALL_ATTENTION_FUNCTIONS,
    Glm4MoeAttention,
    apply_rotary_pos_emb,
    eager_attention_forward,
)

from .names import ModuleNames
from .translation import default_rope, overlay, special_token_ids

DEFAULT_MASK_TOKEN_ID = 156895
"""``<|mask|>`` of LLaDA 2.x's tokenizer: ``generate(mask_id=156895)`` in the original modeling file and dFactory's
``train_llada2_bd.py`` (``mask_token_id=156895``)."""
END_OF_RESPONSE_ID = 156892
"""``<|endoftext|>``, the original ``generate``'s ``eos_id`` default and the Hub config's ``pad_token_id``."""
BLOCK_SIZE = 32
"""Block length of LLaDA 2.x's block diffusion: dFactory's ``block_size: 32`` and the original ``generate``'s
``block_length=32``."""

MODULE_NAMES = ModuleNames((
    ("model.word_embeddings", "model.embed_tokens"),
    ("model.layers.{i}.attention.query_key_value", "model.layers.{i}.self_attn.query_key_value"),
    ("model.layers.{i}.attention.dense", "model.layers.{i}.self_attn.o_proj"),
    ("model.layers.{i}.attention.query_layernorm", "model.layers.{i}.self_attn.q_norm"),
    ("model.layers.{i}.attention.key_layernorm", "model.layers.{i}.self_attn.k_norm"),
    ("model.layers.{i}.mlp.gate.expert_bias", "model.layers.{i}.mlp.gate.e_score_correction_bias"),
))
"""Original LLaDA 2.x module path -> this port's; experts, shared expert, norms and head share their names."""

ORIGINAL_DEFAULTS = {
    "vocab_size": 30592, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
    "num_key_value_heads": 0, "hidden_act": "silu", "use_qkv_bias": False, "use_qk_norm": True, "use_bias": True,
    "rms_norm_eps": 1e-5, "norm_head": False, "tie_word_embeddings": False, "attention_dropout": 0.1,
    "max_position_embeddings": 16384, "rope_theta": 10000.0, "use_sliding_window": False, "rope_scaling": None,
    "pad_token_id": 126081, "num_experts": 16, "num_shared_experts": 0, "num_experts_per_tok": 2, "n_group": 8,
    "topk_group": 4, "routed_scaling_factor": 2.5, "first_k_dense_replace": 0, "partial_rotary_factor": 0.5,
}
"""The defaults of the original ``LLaDA2MoeConfig`` (dLLM's ``configuration_llada2_moe.py``, the same in its
``llada21``) for the fields the port reads: a ``config.json`` without one means what the original code reads."""

# Config fields (with the value the port needs) the original code could set another way.
_REQUIRED = {
    "use_bias": False,  # a bias on the attention output projection
    "use_sliding_window": False,
    "norm_head": False,
    "rope_scaling": None,
    "score_function": "sigmoid",
    "router_dtype": "fp32",
}


def _head_dim(original: dict[str, Any]) -> int:
    return original.get("head_dim") or original["hidden_size"] // original["num_attention_heads"]


def _check_router(original: dict[str, Any]) -> None:
    """Refuse, naming the field, a group-limited router the original's ``group_limited_topk`` cannot run."""
    experts, groups, topk_group = original["num_experts"], original["n_group"], original["topk_group"]
    if not isinstance(groups, int) or groups < 1 or experts % groups:
        raise ValueError(f"LLaDA2 config field n_group={groups!r} must be >= 1 and divide num_experts={experts}")
    if not isinstance(topk_group, int) or not 1 <= topk_group <= groups:
        raise ValueError(f"LLaDA2 config field topk_group={topk_group!r} must be between 1 and n_group={groups}")
    if experts // groups < 2:
        raise ValueError(f"LLaDA2 config field n_group={groups}: num_experts / n_group = {experts // groups}, but a "
                         "group's score is the sum of its top 2 experts (at least 2 per group)")
    if original["num_experts_per_tok"] > topk_group * (experts // groups):
        raise ValueError(f"LLaDA2 config field num_experts_per_tok={original['num_experts_per_tok']!r} exceeds the "
                         f"{topk_group * (experts // groups)} experts of the topk_group={topk_group} chosen groups")


def glm4_moe_config_from_llada2(original: dict[str, Any]) -> Glm4MoeConfig:
    """Translate a LLaDA 2.x ``config.json`` dict into the equivalent ``Glm4MoeConfig`` (a missing field takes the
    original config class's default, :data:`ORIGINAL_DEFAULTS`)."""
    given, original = original, {**ORIGINAL_DEFAULTS, **original}
    for key, expected in _REQUIRED.items():
        if original.get(key, expected) != expected:
            absent = "" if key in given else " (the original's default: the field is absent)"
            raise ValueError(f"LLaDA2 config field {key}={original[key]!r}{absent} is not supported by the native port "
                             f"(expected {expected!r})")
    if not original.get("num_experts") or not original.get("num_shared_experts"):
        raise ValueError("LLaDA2 config fields num_experts / num_shared_experts: the native port needs routed experts "
                         "and at least one shared expert")
    _check_router(original)
    factor = original["partial_rotary_factor"]
    rotary = int(_head_dim(original) * factor)
    if original.get("rotary_dim", rotary) != rotary:
        raise ValueError(f"LLaDA2 config field rotary_dim={original['rotary_dim']!r}: the original code rotates "
                         f"head_dim x partial_rotary_factor = {rotary} dimensions")
    heads = original["num_attention_heads"]
    kv_heads = original.get("num_key_value_heads") or heads  # 0, the original's default: one per query head
    if heads % kv_heads:
        raise ValueError(f"LLaDA2 config field num_key_value_heads={kv_heads!r} must divide num_attention_heads={heads}")
    return Glm4MoeConfig(
        vocab_size=original["vocab_size"],
        hidden_size=original["hidden_size"],
        intermediate_size=original["intermediate_size"],
        moe_intermediate_size=original["moe_intermediate_size"],
        num_hidden_layers=original["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=_head_dim(original),
        hidden_act=original["hidden_act"],
        max_position_embeddings=original["max_position_embeddings"],
        rms_norm_eps=original["rms_norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": original["rope_theta"],
                         "partial_rotary_factor": factor},
        attention_bias=bool(original["use_qkv_bias"]),
        attention_dropout=original["attention_dropout"],  # the original's attention applies it in training
        tie_word_embeddings=bool(original["tie_word_embeddings"]),
        n_routed_experts=original["num_experts"],
        num_experts_per_tok=original["num_experts_per_tok"],
        n_shared_experts=original["num_shared_experts"],
        n_group=original["n_group"],
        topk_group=original["topk_group"],
        routed_scaling_factor=original["routed_scaling_factor"],
        first_k_dense_replace=original["first_k_dense_replace"],
        # The original renormalises the top-k weights whenever top_k > 1, whatever its config's norm_topk_prob says.
        norm_topk_prob=original["num_experts_per_tok"] > 1,
        use_qk_norm=bool(original["use_qk_norm"]),
        **special_token_ids(original, DEFAULT_MASK_TOKEN_ID),
    )


def llada2_config_from_glm4_moe(glm: Glm4MoeConfig, original: dict[str, Any]) -> dict[str, Any]:
    """The LLaDA 2.x ``config.json`` dict of ``glm``: ``original`` (the base's, with its ``auto_map`` and the fields
    the port does not read) with the fields :func:`glm4_moe_config_from_llada2` reads set from ``glm``, each written
    even where ``original`` left it to the original's default (``use_bias: false``, ``partial_rotary_factor``...)."""
    rope = default_rope(glm, "LLaDA2")
    mask = glm.mask_token_id
    return overlay(original, {
        "vocab_size": glm.vocab_size,
        "hidden_size": glm.hidden_size,
        "intermediate_size": glm.intermediate_size,
        "moe_intermediate_size": glm.moe_intermediate_size,
        "num_hidden_layers": glm.num_hidden_layers,
        "num_attention_heads": glm.num_attention_heads,
        "num_key_value_heads": glm.num_key_value_heads,
        "head_dim": glm.head_dim,
        "hidden_act": glm.hidden_act,
        "max_position_embeddings": glm.max_position_embeddings,
        "rms_norm_eps": glm.rms_norm_eps,
        "rope_theta": rope.get("rope_theta", ORIGINAL_DEFAULTS["rope_theta"]),
        "partial_rotary_factor": rope.get("partial_rotary_factor", 1.0),
        "use_bias": False,
        "use_qkv_bias": bool(glm.attention_bias),
        "attention_dropout": glm.attention_dropout,
        "tie_word_embeddings": bool(glm.tie_word_embeddings),
        "num_experts": glm.n_routed_experts,
        "num_experts_per_tok": glm.num_experts_per_tok,
        "num_shared_experts": glm.n_shared_experts,
        "n_group": glm.n_group,
        "topk_group": glm.topk_group,
        "routed_scaling_factor": glm.routed_scaling_factor,
        "first_k_dense_replace": glm.first_k_dense_replace,
        "use_qk_norm": bool(glm.use_qk_norm),
        "pad_token_id": glm.pad_token_id,
        "bos_token_id": glm.bos_token_id,
        "eos_token_id": glm.eos_token_id,
        # The Hub config names no mask id (generate takes it): written only when it says something.
        "mask_token_id": mask if "mask_token_id" in original or mask != DEFAULT_MASK_TOKEN_ID else None,
    })


class LLaDA2Attention(Glm4MoeAttention):
    """GLM-4-MoE attention with LLaDA 2.x's one ``query_key_value`` projection ([q heads | k heads | v heads] rows)."""

    def __init__(self, config: Glm4MoeConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        del self.q_proj, self.k_proj, self.v_proj
        self.head_counts = (config.num_attention_heads, config.num_key_value_heads, config.num_key_value_heads)
        self.query_key_value = nn.Linear(config.hidden_size, sum(self.head_counts) * self.head_dim, bias=config.attention_bias)

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None, cache: Any = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        input_shape = hidden_states.shape[:-1]
        qkv = self.query_key_value(hidden_states).view(*input_shape, -1, self.head_dim)
        query, key, value = qkv.split(self.head_counts, dim=-2)
        if self.use_qk_norm:
            query, key = self.q_norm(query), self.k_norm(key)
        query, key, value = (tensor.transpose(1, 2) for tensor in (query, key, value))
        query, key = apply_rotary_pos_emb(query, key, *position_embeddings)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        output, weights = attend(self, query, key, value, attention_mask,
                                 dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
                                 **kwargs)
        return self.o_proj(output.reshape(*input_shape, -1).contiguous()), weights


class LLaDA2ForCausalLM(Glm4MoeForCausalLM):
    """``Glm4MoeForCausalLM`` whose attention is :class:`LLaDA2Attention`; everything else is transformers'."""

    def __init__(self, config: Glm4MoeConfig) -> None:
        super().__init__(config)
        for index, layer in enumerate(self.model.layers):
            layer.self_attn = LLaDA2Attention(config, index)
        self.post_init()

    @classmethod
    def _can_set_experts_implementation(cls) -> bool:
        """transformers offers its grouped-GEMM experts (its default) only to a class whose module's source uses
        ``@use_experts_implementation``; this module holds no experts, GLM-4-MoE's (which do) are used unchanged. Without
        this the experts loop over all 256 in Python: on an H100, 634 ms per LLaDA2.0-mini forward at batch 1."""
        return Glm4MoeForCausalLM._can_set_experts_implementation()
