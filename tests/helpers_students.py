"""Tiny original-layout checkpoints of the newer students, written by the tests themselves.

LLaDA-MoE: a ``config.json`` with the fields of inclusionAI's ``LLaDAConfig`` (``model_type: llada``, as the Hub's
LLaDA-MoE-7B-A1B config has it) at toy sizes, weights named as the original ``modeling_lladamoe.py`` names them (one
tensor per expert), and its logits from the independent reference of ``original_reference.py``. One dense layer
(``moe_layer_freq`` 0) and grouped kv heads exercise paths the 7B model does not take.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from original_reference import LLaDAMoEModelLM
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


def write_llada_moe_checkpoint(folder: Path, tokenizer: Any = None) -> Path:
    """The tiny LLaDA-MoE in the original layout in ``folder``, with ``parity.safetensors`` (input ids with masks,
    and the reference logits); with ``tokenizer``, sized for it and saved beside it, as a Hub folder is."""
    folder.mkdir(parents=True, exist_ok=True)
    config = LLADA_MOE_TINY if tokenizer is None else {
        **LLADA_MOE_TINY, "vocab_size": len(tokenizer), "mask_token_id": tokenizer.mask_token_id,
        "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    model = LLaDAMoEModelLM(config).eval()
    _initialise(model, config["mask_token_id"])
    save_file({key: value.contiguous() for key, value in model.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    mask_id = config["mask_token_id"]
    input_ids = torch.randint(0, min(config["vocab_size"], MASK_ID) - 1, (2, 24), generator=torch.Generator().manual_seed(1))
    input_ids[0, [3, 7, 8, 15, 20, 21, 22, 23]] = mask_id
    input_ids[1, [0, 5, 11, 12, 13, 18]] = mask_id
    with torch.no_grad():
        logits = model(input_ids)
    save_file({"input_ids": input_ids, "logits": logits}, folder / "parity.safetensors")
    return folder

