"""Tiny original-layout checkpoints of the newer students, written by the tests themselves.

LLaDA-MoE: a ``config.json`` with the fields of inclusionAI's ``LLaDAConfig`` (``model_type: llada``, as the Hub's
LLaDA-MoE-7B-A1B config has it) at toy sizes, weights named as the original ``modeling_lladamoe.py`` names them (one
tensor per expert), and its logits from the independent reference of ``original_reference.py``. One dense layer
(``moe_layer_freq`` 0) and grouped kv heads exercise paths the 7B model does not take.

LLaDA 2.x: the fields of LLaDA2.0-mini's ``config.json`` (dFactory ``configs/model_configs/llada2_mini/config.json``,
``model_type`` as the Hub's ``llada2_moe``) at toy sizes, weights named as ``modeling_llada2_moe.py`` names them, a
non-zero expert bias (it changes which experts are chosen), and the reference's logits both fully bidirectional and
under the block-causal mask (blocks of :data:`LLADA2_TINY_BLOCK`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from original_reference import LLaDA2MoeModelLM, LLaDAMoEModelLM
from safetensors.torch import save_file

MASK_ID = 255

LLADA_MOE_TINY: dict[str, Any] = {
    "architectures": ["LLaDAMoEModelLM"],
    "auto_map": {"AutoConfig": "configuration_lladamoe.LLaDAConfig",
                 "AutoModel": "modeling_lladamoe.LLaDAMoEModelLM",
                 "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM"},
    "model_type": "llada",
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None, "clip_qkv": None,
    "dense_intermediate_size": 96, "eos_token_id": 254, "expert_intermediate_size": 32, "hidden_act": "silu",
    "hidden_size": 64, "initializer_range": 0.02, "mask_token_id": MASK_ID, "max_position_embeddings": 512,
    "moe_layer_freq": [0, 1, 1],
    "moe_router_enable_expert_bias": False, "moe_router_score_function": "softmax", "norm_topk_prob": False,
    "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 3,
    "num_key_value_heads": 2, "output_router_logits": False, "pad_token_id": 254, "partial_rotary_factor": 1,
    "qk_layernorm": True, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 50000.0,
    "routed_scaling_factor": 1, "router_aux_loss_coef": 0.01, "router_num_group": None, "router_topk_group": None,
    "shared_expert_intermediate_size": None, "tie_word_embeddings": False, "torch_dtype": "float32",
    "use_cache": False, "vocab_size": 256,
}


def _initialise(model: torch.nn.Module, mask_id: int) -> None:
    """Seeded weights with non-trivial norms, and a zero LM-head row for the mask (its logit never wins the argmax)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name:
                parameter.copy_(1 + 0.1 * noise)
            elif parameter.dim() == 2 and "embed" not in name:
                parameter.copy_(noise / parameter.shape[1] ** 0.5 * (3.0 if name.endswith("gate.weight") else 1.0))
            else:
                parameter.copy_(noise)
        model.lm_head.weight[mask_id] = 0


def _sized(config: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """``config`` as it is, or sized for ``tokenizer`` (its vocabulary, mask, EOS and pad ids)."""
    if tokenizer is None:
        return config
    return {**config, "vocab_size": len(tokenizer), "mask_token_id": tokenizer.mask_token_id,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}


def _write(folder: Path, model: torch.nn.Module, config: dict[str, Any], tokenizer: Any) -> torch.Tensor:
    """Write ``model``'s weights (original names), ``config`` and the tokenizer, as a Hub folder holds them; return the
    parity input ids (two rows of 24 tokens with masks at fixed places)."""
    save_file({key: value.contiguous() for key, value in model.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    mask_id = config["mask_token_id"]
    input_ids = torch.randint(0, min(config["vocab_size"], MASK_ID) - 1, (2, 24), generator=torch.Generator().manual_seed(1))
    input_ids[0, [3, 7, 8, 15, 20, 21, 22, 23]] = mask_id
    input_ids[1, [0, 5, 11, 12, 13, 18]] = mask_id
    return input_ids


def write_llada_moe_checkpoint(folder: Path, tokenizer: Any = None) -> Path:
    """The tiny LLaDA-MoE in the original layout in ``folder``, with ``parity.safetensors`` (input ids with masks,
    and the reference logits); with ``tokenizer``, sized for it and saved beside it, as a Hub folder is."""
    folder.mkdir(parents=True, exist_ok=True)
    config = _sized(LLADA_MOE_TINY, tokenizer)
    model = LLaDAMoEModelLM(config).eval()
    _initialise(model, config["mask_token_id"])
    input_ids = _write(folder, model, config, tokenizer)
    with torch.no_grad():
        logits = model(input_ids)
    save_file({"input_ids": input_ids, "logits": logits}, folder / "parity.safetensors")
    return folder

LLADA2_TINY_BLOCK = 8
LLADA2_TINY: dict[str, Any] = {
    "architectures": ["LLaDA2MoeModelLM"],
    "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                 "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                 "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
    "model_type": "llada2_moe",
    "attention_dropout": 0.0, "embedding_dropout": 0.0, "eos_token_id": 254, "first_k_dense_replace": 1,
    "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
    "mask_token_id": MASK_ID,  # not in the Hub's config (generate takes it); the tiny vocabulary has no 156895
    "max_position_embeddings": 512, "max_window_layers": 28, "moe_intermediate_size": 32,
    "moe_router_enable_expert_bias": True, "n_group": 4, "norm_head": False, "norm_softmax": False,
    "norm_topk_prob": True, "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
    "num_hidden_layers": 3, "num_key_value_heads": 2, "num_shared_experts": 1, "output_dropout": 0.0,
    "output_router_logits": False, "pad_token_id": 254, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 600000, "rotary_dim": 8, "routed_scaling_factor": 2.5, "router_dtype": "fp32",
    "score_function": "sigmoid", "tie_word_embeddings": False, "topk_group": 2, "torch_dtype": "float32",
    "use_bias": False, "use_cache": False, "use_qk_norm": True, "use_qkv_bias": False, "use_rmsnorm": True,
    "use_sliding_window": False, "using_split_qkv_in_self_attention": False, "vocab_size": 256,
}


def block_causal(length: int, block: int) -> torch.Tensor:
    """The original ``generate``'s mask, bool [1, 1, length, length]: position i may attend to j iff j's block <= i's."""
    blocks = torch.arange(length) // block
    return (blocks[None, :] <= blocks[:, None])[None, None]


def write_llada2_checkpoint(folder: Path, tokenizer: Any = None) -> Path:
    """The tiny LLaDA 2.x in the original layout in ``folder``, with ``parity.safetensors`` (input ids with masks, the
    reference logits bidirectional and block-causal); with ``tokenizer``, sized for it and saved beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    config = _sized(LLADA2_TINY, tokenizer)
    model = LLaDA2MoeModelLM(config).eval()
    _initialise(model, config["mask_token_id"])
    generator = torch.Generator().manual_seed(2)
    for layer in model.model.layers[config["first_k_dense_replace"]:]:
        layer.mlp.gate.expert_bias.copy_(0.2 * torch.randn(config["num_experts"], generator=generator))
    input_ids = _write(folder, model, config, tokenizer)
    with torch.no_grad():
        logits = model(input_ids)
        block_logits = model(input_ids, attention_mask=block_causal(input_ids.shape[1], LLADA2_TINY_BLOCK))
    save_file({"input_ids": input_ids, "logits": logits, "block_logits": block_logits}, folder / "parity.safetensors")
    return folder
