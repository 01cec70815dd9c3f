"""LLaDA 2.x (``LLaDA2MoeModelLM``): the native port against the reference of the original code, and its config."""

from __future__ import annotations

import pytest
import torch
from helpers_students import LLADA2_TINY, LLADA2_TINY_BLOCK, block_causal
from safetensors.torch import load_file

from trims_hf import load_student
from trims_hf.students import STUDENTS, detect_student_kind
from trims_hf.students.llada2 import glm4_moe_config_from_llada2


@pytest.fixture(scope="module")
def llada2(original_checkpoint):
    return original_checkpoint("llada2")


def test_logits_equal_the_reference_bidirectional_and_block_causal(llada2):
    parity = load_file(llada2 / "parity.safetensors")
    ids = parity["input_ids"]
    model = load_student(str(llada2)).eval()
    with torch.no_grad():
        full = model(input_ids=ids).logits
        blocked = model(input_ids=ids, attention_mask=block_causal(ids.shape[1], LLADA2_TINY_BLOCK)).logits
    torch.testing.assert_close(full, parity["logits"], atol=1e-4, rtol=0)
    torch.testing.assert_close(blocked, parity["block_logits"], atol=1e-4, rtol=0)
    # The fixture's masks change the logits (the block-causal mask is honoured, not ignored).
    assert (parity["logits"] - parity["block_logits"]).abs().max() > 1e-2


def test_hub_config_is_detected_and_lora_wraps_the_original_projections(llada2):
    assert detect_student_kind({"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"]}) == "llada2"
    model = load_student(str(llada2))
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    assert set(STUDENTS["llada2"].lora_target_modules) <= names
    assert STUDENTS["llada2"].module_names.to_original("model.layers.2.self_attn.o_proj") == "model.layers.2.attention.dense"


@pytest.mark.parametrize(("field", "value"), [("use_bias", True), ("rope_scaling", {"type": "yarn"}),
                                              ("score_function", "softmax"), ("rotary_dim", 16),
                                              ("num_shared_experts", 0)])
def test_unsupported_config_fields_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        glm4_moe_config_from_llada2({**LLADA2_TINY, field: value})


def test_router_renormalises_top_k_whatever_the_config_says():
    assert glm4_moe_config_from_llada2({**LLADA2_TINY, "norm_topk_prob": False}).norm_topk_prob is True
    assert glm4_moe_config_from_llada2({**LLADA2_TINY, "num_experts_per_tok": 1}).norm_topk_prob is False
