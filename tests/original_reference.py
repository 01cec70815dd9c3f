"""Independent plain-PyTorch references of the original LLaDA, LLaDA-MoE and Dream models, with the original module names.

Written for the tests from the public descriptions of the original code (GSAI-ML LLaDA ``modeling_llada.py``:
``LLaDAModelLM.model.transformer.{wte, blocks.N.{attn_norm, q_proj, k_proj, v_proj, attn_out, ff_norm, ff_proj,
up_proj, ff_out}, ln_f, ff_out}``; Dream-org ``modeling_dream.py``: ``DreamModel.{model.{embed_tokens, layers.N.
{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, norm}, lm_head}``)
and ../shared/fixtures/README.md: pre-norm blocks, RMSNorm computed in float32, half-split RoPE with float32 angles,
fully bidirectional attention, SwiGLU MLP. LLaDA-MoE follows inclusionAI's ``modeling_lladamoe.py`` as dLLM ships it
(ZHZisZZ/dllm ``dllm/pipelines/llada/models/modeling_lladamoe.py`` at ca176752; ``LLaDAMoEModelLM.{model.{embed_tokens,
layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm, mlp.{gate,
experts.E.{gate,up,down}_proj} or mlp.{gate,up,down}_proj}, norm}, lm_head}``): q and k RMS-normalised per head before
RoPE, a float32 softmax router whose top-k weights are not renormalised, a dense MLP where ``moe_layer_freq`` is 0.
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


REFERENCES = {"llada": LLaDAModelLM, "llada_moe": LLaDAMoEModelLM, "dream": DreamModel}


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
