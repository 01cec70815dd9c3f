"""Independent plain-PyTorch references of the original LLaDA, LLaDA-MoE and Dream models, with the original module names.

Written for the tests from the public descriptions of the original code (GSAI-ML LLaDA ``modeling_llada.py``:
``LLaDAModelLM.model.transformer.{wte, blocks.N.{attn_norm, q_proj, k_proj, v_proj, attn_out, ff_norm, ff_proj,
up_proj, ff_out}, ln_f, ff_out}``; Dream-org ``modeling_dream.py``: ``DreamModel.{model.{embed_tokens, layers.N.
{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, norm}, lm_head}``)
and tests/fixtures/README.md: pre-norm blocks, RMSNorm computed in float32, half-split RoPE with float32 angles,
fully bidirectional attention, SwiGLU MLP. LLaDA-MoE follows inclusionAI's ``modeling_lladamoe.py`` as dLLM ships it
(ZHZisZZ/dllm ``dllm/pipelines/llada/models/modeling_lladamoe.py`` at ca176752; ``LLaDAMoEModelLM.{model.{embed_tokens,
layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm, mlp.{gate,
experts.E.{gate,up,down}_proj} or mlp.{gate,up,down}_proj}, norm}, lm_head}``): q and k RMS-normalised per head before
RoPE, a float32 softmax router whose top-k weights are not renormalised, a dense MLP where ``moe_layer_freq`` is 0.
LLaDA 2.x follows ``modeling_llada2_moe.py`` (ZHZisZZ/dllm ``dllm/pipelines/llada2/models`` at ca176752, the same file
as dFactory's ``models/llada2_moe``): a fused ``query_key_value``, per-head q/k RMSNorm, partial half-split RoPE, a
sigmoid group-limited router with an expert bias, a shared expert, dense first layers, and an explicit attention mask.
Checked once against that file run under transformers 4.57 (docs/students.md). Nothing here uses transformers,
so a checkpoint read into it by name (``load_state_dict(strict=True)``) checks the saved names, shapes and values
against the original architecture.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x`` [batch, heads, length, head_dim]: dimension i pairs with i + head_dim / 2."""
    length, dim = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq).repeat(1, 2)
    rotated = torch.cat([-x[..., dim // 2:], x[..., : dim // 2]], dim=-1)
    return (x.float() * angles.cos() + rotated.float() * angles.sin()).to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int,
              theta: float) -> torch.Tensor:
    """Bidirectional multi-head attention over [batch, length, features] projections (GQA by repeating kv heads)."""
    batch, length, _ = q.shape
    q, k, v = (t.view(batch, length, n, -1).transpose(1, 2) for t, n in ((q, heads), (k, kv_heads), (v, kv_heads)))
    q, k = rope(q, theta), rope(k, theta)
    k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, -1)


class LLaDABlock(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        d, kv = c["d_model"], c["d_model"] // c["n_heads"] * c["n_kv_heads"]
        self.c = c
        self.attn_norm, self.ff_norm = RMSNorm(d, c["rms_norm_eps"]), RMSNorm(d, c["rms_norm_eps"])
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d, bias=False), nn.Linear(d, kv, bias=False),
                                                 nn.Linear(d, kv, bias=False))
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_proj, self.up_proj = (nn.Linear(d, c["mlp_hidden_size"], bias=False),
                                      nn.Linear(d, c["mlp_hidden_size"], bias=False))
        self.ff_out = nn.Linear(c["mlp_hidden_size"], d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.attn_norm(x)
        x = x + self.attn_out(attention(self.q_proj(n), self.k_proj(n), self.v_proj(n), self.c["n_heads"],
                                        self.c["n_kv_heads"], self.c["rope_theta"]))
        n = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(n)) * self.up_proj(n))


class LLaDAModel(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(c["embedding_size"], c["d_model"]),
            "blocks": nn.ModuleList(LLaDABlock(c) for _ in range(c["n_layers"])),
            "ln_f": RMSNorm(c["d_model"], c["rms_norm_eps"]),
            "ff_out": nn.Linear(c["d_model"], c["embedding_size"], bias=False),
        })

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.transformer.wte(input_ids)
        for block in self.transformer.blocks:
            x = block(x)
        return self.transformer.ff_out(self.transformer.ln_f(x))


class LLaDAModelLM(nn.Module):
    """Original LLaDA: logits at position i predict token i."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.model = LLaDAModel(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)


class DreamAttention(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        d, kv = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"] * c["num_key_value_heads"]
        self.c = c
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, kv), nn.Linear(d, kv)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.c["num_attention_heads"],
                                     self.c["num_key_value_heads"], self.c["rope_theta"]))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` (Dream's MLP, LLaDA-MoE's dense MLP and each expert)."""

    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False),
                                                        nn.Linear(h, d, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DreamLayer(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = DreamAttention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c["hidden_size"], c["intermediate_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    """Embedding, ``layers``, final norm (Dream's and LLaDA-MoE's ``model``)."""

    def __init__(self, c: dict[str, Any], layers: list[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class DreamModel(nn.Module):
    """Original Dream: the forward does not shift (its generation code reads token i at position i - 1)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.model = Body(config, [DreamLayer(config) for _ in range(config["num_hidden_layers"])])
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))


class SparseMoE(nn.Module):
    """Every expert on every token, then the top-k softmax weights (zero elsewhere) mix them."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.top_k = c["num_experts_per_tok"]
        self.gate = nn.Linear(c["hidden_size"], c["num_experts"], bias=False)
        self.experts = nn.ModuleList(MLP(c["hidden_size"], c["expert_intermediate_size"])
                                     for _ in range(c["num_experts"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.gate(x).float().softmax(-1)
        top, chosen = probs.topk(self.top_k, dim=-1)
        weights = torch.zeros_like(probs).scatter(-1, chosen, top).to(x.dtype)  # [batch, length, experts]
        outputs = torch.stack([expert(x) for expert in self.experts], dim=-2)  # [batch, length, experts, d]
        return (weights.unsqueeze(-1) * outputs).sum(-2)


class LLaDAMoEAttention(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        d, heads = c["hidden_size"], c["num_attention_heads"]
        self.head_dim, self.c = d // heads, c
        kv = self.head_dim * c["num_key_value_heads"]
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(d, d, bias=False), nn.Linear(d, kv, bias=False), nn.Linear(
            d, kv, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.q_norm, self.k_norm = RMSNorm(self.head_dim, c["rms_norm_eps"]), RMSNorm(self.head_dim, c["rms_norm_eps"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, length, -1, self.head_dim)).view(batch, length, -1)
        k = self.k_norm(self.k_proj(x).view(batch, length, -1, self.head_dim)).view(batch, length, -1)
        return self.o_proj(attention(q, k, self.v_proj(x), self.c["num_attention_heads"], self.c["num_key_value_heads"],
                                     self.c["rope_theta"]))


class LLaDAMoELayer(nn.Module):
    def __init__(self, c: dict[str, Any], sparse: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = LLaDAMoEAttention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = SparseMoE(c) if sparse else MLP(c["hidden_size"], c["dense_intermediate_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LLaDAMoEModelLM(nn.Module):
    """Original LLaDA-MoE: logits at position i predict token i."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.model = Body(config, [LLaDAMoELayer(config, freq != 0) for freq in config["moe_layer_freq"]])
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))


def partial_rope(x: torch.Tensor, theta: float, rotary: int, positions: torch.Tensor) -> torch.Tensor:
    """LLaDA 2.x RoPE: the first ``rotary`` dimensions of each head rotated half-split, the rest passed through."""
    inv_freq = theta ** (-torch.arange(0, rotary, 2, dtype=torch.float32) / rotary)
    angles = (positions[:, None, :, None].float() * inv_freq).repeat(1, 1, 1, 2)  # [batch, 1, length, rotary]
    part, rest = x[..., :rotary], x[..., rotary:]
    rotated = torch.cat([-part[..., rotary // 2:], part[..., : rotary // 2]], dim=-1)
    return torch.cat([(part * angles.cos() + rotated * angles.sin()).to(x.dtype), rest], dim=-1)


class LLaDA2Gate(nn.Module):
    """Sigmoid scores; experts chosen on scores + expert_bias within the best ``topk_group`` groups (a group scores
    its top-2 sum); the chosen bias-free scores renormalised (top_k > 1) and scaled by ``routed_scaling_factor``."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.c = c
        self.weight = nn.Parameter(torch.empty(c["num_experts"], c["hidden_size"]))
        self.register_buffer("expert_bias", torch.zeros(c["num_experts"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Dense [tokens, experts] mixing weights (zero for experts not chosen)."""
        c = self.c
        scores = (x.float() @ self.weight.float().T).sigmoid()
        biased = scores + self.expert_bias
        groups = biased.view(len(x), c["n_group"], -1).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(groups).scatter(1, groups.topk(c["topk_group"], dim=-1).indices, 1.0)
        allowed = keep.repeat_interleave(c["num_experts"] // c["n_group"], dim=1).bool()
        chosen = biased.masked_fill(~allowed, float("-inf")).topk(c["num_experts_per_tok"], dim=-1).indices
        top = scores.gather(1, chosen)
        if c["num_experts_per_tok"] > 1:
            top = top / (top.sum(-1, keepdim=True) + 1e-20)
        return torch.zeros_like(scores).scatter(1, chosen, top * c["routed_scaling_factor"])


class LLaDA2SparseMoE(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.gate = LLaDA2Gate(c)
        self.experts = nn.ModuleList(MLP(c["hidden_size"], c["moe_intermediate_size"]) for _ in range(c["num_experts"]))
        self.shared_experts = MLP(c["hidden_size"], c["moe_intermediate_size"] * c["num_shared_experts"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights = self.gate(flat).to(x.dtype)  # [tokens, experts]
        outputs = torch.stack([expert(flat) for expert in self.experts], dim=1)  # [tokens, experts, d]
        return (weights.unsqueeze(-1) * outputs).sum(1).view_as(x) + self.shared_experts(x)


class LLaDA2Attention(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.c, d = c, c["hidden_size"]
        self.head_dim = c.get("head_dim") or d // c["num_attention_heads"]
        self.rotary = int(self.head_dim * c["partial_rotary_factor"])
        width = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * self.head_dim
        self.query_key_value = nn.Linear(d, width, bias=c["use_qkv_bias"])
        self.query_layernorm = RMSNorm(self.head_dim, c["rms_norm_eps"])
        self.key_layernorm = RMSNorm(self.head_dim, c["rms_norm_eps"])
        self.dense = nn.Linear(c["num_attention_heads"] * self.head_dim, d, bias=c["use_bias"])

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        heads, kv_heads = self.c["num_attention_heads"], self.c["num_key_value_heads"]
        qkv = self.query_key_value(x).view(batch, length, heads + 2 * kv_heads, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
        q, k = self.query_layernorm(q), self.key_layernorm(k)
        theta = self.c["rope_theta"]
        q, k = partial_rope(q, theta, self.rotary, positions), partial_rope(k, theta, self.rotary, positions)
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~allowed, float("-inf"))
        return self.dense((scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, -1))


class LLaDA2Layer(nn.Module):
    def __init__(self, c: dict[str, Any], sparse: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.attention = LLaDA2Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = LLaDA2SparseMoE(c) if sparse else MLP(c["hidden_size"], c["intermediate_size"])

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.input_layernorm(x), allowed, positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class LLaDA2Body(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(LLaDA2Layer(c, i >= c["first_k_dense_replace"]) for i in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LLaDA2MoeModelLM(nn.Module):
    """Original LLaDA 2.x (inclusionAI ``modeling_llada2_moe.py``, ZHZisZZ/dllm ``dllm/pipelines/llada2/models`` at
    ca176752): logits at position i predict token i. ``attention_mask`` is a bool [batch or 1, 1, length, length]
    "may attend" mask (the original's block-causal mask; default all True), ``position_ids`` default 0..length-1."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.model = LLaDA2Body(config)
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        batch, length = input_ids.shape
        allowed = attention_mask if attention_mask is not None else torch.ones(1, 1, length, length, dtype=torch.bool)
        positions = position_ids if position_ids is not None else torch.arange(length).expand(batch, length)
        x = self.model.word_embeddings(input_ids)
        for layer in self.model.layers:
            x = layer(x, allowed, positions)
        return self.lm_head(self.model.norm(x))


REFERENCES = {"llada": LLaDAModelLM, "llada_moe": LLaDAMoEModelLM, "llada2": LLaDA2MoeModelLM, "dream": DreamModel}


def load_reference(folder: str, kind: str) -> nn.Module:
    """The reference of ``kind`` built from ``folder``'s config.json and read by name from its weights (strict)."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    config = json.loads((Path(folder) / "config.json").read_text())
    model = REFERENCES[kind](config)
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(Path(folder).glob("model*.safetensors")):
        state.update(load_file(shard))
    model.load_state_dict(state, strict=True)
    return model.eval()
