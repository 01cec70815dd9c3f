"""Students: native LLaDA / LLaDA-MoE / Dream ports reproduce the reference logits; attention is bidirectional."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FIXTURES, tiny_student
from helpers_students import LLADA_MOE_TINY
from safetensors.torch import load_file

from trims_hf import (
    MaskTokenError,
    StudentKindError,
    detect_student_kind,
    load_student,
    mask_token_id,
    student_logits,
    student_mask_token_id,
    student_spec,
)
from trims_hf.students import student_config
from trims_hf.students.llada import llama_config_from_llada


@pytest.mark.parametrize("name,kind", [("llada_tiny", "llada"), ("dream_tiny", "dream")])
def test_fixture_parity(name, kind):
    model = load_student(str(FIXTURES / name))
    parity = load_file(str(FIXTURES / name / "parity.safetensors"))
    assert student_spec(model).kind == kind and mask_token_id(model) == 255
    with torch.no_grad():
        raw = model(input_ids=parity["input_ids"]).logits
        aligned = student_logits(model, parity["input_ids"])
    torch.testing.assert_close(raw, parity["logits"], atol=1e-4, rtol=1e-4)
    if kind == "dream":
        torch.testing.assert_close(aligned, parity["logits_shifted_for_generation"], atol=1e-4, rtol=1e-4)
    else:
        assert torch.equal(aligned, raw)


def test_saved_student_reloads(tmp_path):
    model = load_student(str(FIXTURES / "llada_tiny"))
    model.save_pretrained(tmp_path)
    again = load_student(str(tmp_path))
    ids = load_file(str(FIXTURES / "llada_tiny" / "parity.safetensors"))["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)
    assert student_spec(again).kind == "llada"


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_attention_is_bidirectional_and_respects_padding(tokenizer, kind):
    model = tiny_student(tokenizer, kind).eval()
    ids = torch.randint(3, len(tokenizer), (1, 12))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % len(tokenizer)
    with torch.no_grad():
        first = model(input_ids=ids).logits
        second = model(input_ids=changed).logits
        # a change in the last token moves the logits of the first one: no causal mask
        assert not torch.allclose(first[0, 0], second[0, 0])
        # left padding with a mask and shifted positions equals the unpadded sequence
        padded = torch.cat([torch.full((1, 3), tokenizer.pad_token_id), ids], dim=1)
        attention = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 12, dtype=torch.long)], dim=1)
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        out = model(input_ids=padded, attention_mask=attention, position_ids=positions).logits
    torch.testing.assert_close(out[:, 3:], first, atol=1e-5, rtol=1e-5)


def test_unsupported_llada_config_is_rejected():
    config = json.loads((FIXTURES / "llada_tiny" / "config.json").read_text())
    with pytest.raises(ValueError, match="alibi"):
        llama_config_from_llada({**config, "alibi": True})


@pytest.fixture
def plain_llama_folder(tmp_path, tokenizer):
    """A Llama causal LM as transformers saves it (no student mark, no mask id on its config) with the test tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return str(tmp_path)


def test_plain_causal_lm_needs_its_kind_and_takes_the_tokenizers_mask(plain_llama_folder, tokenizer):
    with pytest.raises(StudentKindError, match="kind='llada'") as error:
        load_student(plain_llama_folder)
    assert error.value.model_type == "llama"
    model = load_student(plain_llama_folder, kind="dream")
    assert student_spec(model).kind == "dream" and mask_token_id(model) == tokenizer.mask_token_id
    assert mask_token_id(load_student(plain_llama_folder, kind="llada", mask_token_id=5)) == 5


def test_mask_token_id_comes_from_the_caller_then_config_then_tokenizer(tokenizer):
    config = {"model_type": "llama", "vocab_size": 400, "mask_token_id": 9}
    assert student_mask_token_id(config, "llada", 3, tokenizer) == 3
    assert student_mask_token_id(config, "llada", None, tokenizer) == 9
    assert student_mask_token_id({"model_type": "llama", "vocab_size": 400}, "llada", None, tokenizer) == \
        tokenizer.mask_token_id
    native = json.loads((FIXTURES / "llada_tiny" / "config.json").read_text())
    assert student_mask_token_id(native, "llada") == 255  # LLaDA's own config, translated
    with pytest.raises(MaskTokenError, match="no mask token id"):
        student_mask_token_id({"model_type": "llama", "vocab_size": 400}, "llada")
    with pytest.raises(MaskTokenError, match="outside the vocabulary"):
        student_mask_token_id(config, "llada", 400)


def test_recipes_take_the_mask_token_id(plain_llama_folder, tokenizer, tmp_path):
    from trims_hf.commands.recipe import parse_recipe
    from trims_hf.model_config import resolve_student
    from trims_hf.training.train_job import ModelArguments, build_student

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model_name_or_path: {plain_llama_folder}\nmodel_kind: llada\ndataset_name: rows.jsonl\n"
                      f"output_dir: {tmp_path / 'out'}\n")
    model_args, _, _ = parse_recipe(recipe, ["--mask_token_id", "7"])
    built = build_student(model_args, resolve_student(model_args, tokenizer=tokenizer))
    assert model_args.mask_token_id == 7 and mask_token_id(built) == 7
    scratch = ModelArguments(plain_llama_folder, model_kind="llada", init_from_config=True, mask_token_id=6)
    assert mask_token_id(build_student(scratch, resolve_student(scratch, tokenizer=tokenizer))) == 6


def test_llada_moe_port_gives_the_reference_logits_and_is_recognised_from_its_config(original_checkpoint):
    folder = original_checkpoint("llada_moe")
    model = load_student(str(folder))
    parity = load_file(str(folder / "parity.safetensors"))
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and student_spec(model).kind == "llada_moe"
    assert mask_token_id(model) == 255
    with torch.no_grad():
        logits = model(input_ids=parity["input_ids"]).logits
        aligned = student_logits(model, parity["input_ids"])
    torch.testing.assert_close(logits, parity["logits"], atol=1e-4, rtol=1e-4)
    assert torch.equal(aligned, logits)  # unshifted, as LLaDA


@pytest.mark.parametrize("change,kind", [
    ({}, "llada_moe"),
    ({"model_type": "lladamoe"}, "llada_moe"),  # as dLLM asks its users to rewrite the Hub config
    ({"model_type": "llama", "trims_student": "llada_moe"}, "llada_moe"),  # saved natively by trims_hf
])
def test_llada_moe_is_told_apart_from_llada_8b(change, kind):
    assert detect_student_kind({**LLADA_MOE_TINY, **change}) == kind
    llada_8b = json.loads((FIXTURES / "llada_tiny" / "config.json").read_text())
    assert llada_8b["model_type"] == LLADA_MOE_TINY["model_type"] == "llada" and detect_student_kind(llada_8b) == "llada"


@pytest.mark.parametrize("change,message", [
    ({"shared_expert_intermediate_size": 64}, "shared expert"),
    ({"moe_router_enable_expert_bias": True}, "expert bias"),
    ({"qk_layernorm": False}, "qk_layernorm"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"moe_layer_freq": [1, 1]}, "moe_layer_freq has 2 entries for 3 layers"),
])
def test_llada_moe_features_the_port_cannot_express_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        student_config({**LLADA_MOE_TINY, **change}, "llada_moe")


def test_llada_moe_ignores_the_configs_norm_topk_prob_as_the_original_does():
    """The original MoE block hard-codes ``norm_topk_prob = False``: a config saying True changes nothing."""
    assert student_config({**LLADA_MOE_TINY, "norm_topk_prob": True}, "llada_moe").norm_topk_prob is False


def test_llada_moe_attention_is_bidirectional_and_lora_wraps_attention_only(original_checkpoint):
    from peft import get_peft_model

    from trims_hf import lora_config

    model = load_student(str(original_checkpoint("llada_moe")))
    ids = load_file(str(original_checkpoint("llada_moe") / "parity.safetensors"))["input_ids"][:1]
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 250
    with torch.no_grad():
        assert not torch.allclose(model(input_ids=ids).logits[0, 0], model(input_ids=changed).logits[0, 0])
    wrapped = get_peft_model(model, lora_config(model, r=4))
    targets = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name, _ in wrapped.named_parameters() if ".lora_" in name}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj"}


def test_llada_moe_training_loss_has_no_router_auxiliary_loss(original_checkpoint):
    """dLLM's MDLM trainer (the one that trains LLaDA-MoE) takes its loss from the logits alone: so does ours."""
    from trims_hf.students.loss import mdlm_loss

    model = load_student(str(original_checkpoint("llada_moe"))).train()
    ids = load_file(str(original_checkpoint("llada_moe") / "parity.safetensors"))["input_ids"]
    masked = ids == 255
    labels = torch.randint(0, 250, ids.shape, generator=torch.Generator().manual_seed(0))
    weights = torch.tensor([2.0, 0.5])
    out = model(input_ids=ids, labels=labels, masked=masked, loss_weights=weights, num_items_in_batch=torch.tensor(14))
    assert out.get("aux_loss") is None and not model.config.output_router_logits
    expected = mdlm_loss(out.logits, labels, masked, weights, student_spec(model), torch.tensor(14))
    torch.testing.assert_close(out.loss, expected)


def test_each_compiled_block_is_handed_the_cache_layer_its_attention_names(tokenizer):
    """``compile_blocks`` hands each block, in place of a cache that offers it, the layer its attention updates (the
    graphs then never see a layer index); a block whose modules name several layers keeps the whole cache."""
    from trims_hf.students import compile_blocks
    from trims_hf.students.base import _CompiledBlockCall

    model = tiny_student(tokenizer, layers=3)
    model.model.layers[2].mlp.layer_idx = 0  # as if this block also read layer 0's cache
    compile_blocks(model)  # lazy: nothing compiles until a block runs
    calls = [block._compiled_call_impl for block in model.model.layers]
    assert [call.layer_idx for call in calls[:2]] == [block.self_attn.layer_idx for block in model.model.layers[:2]]
    assert calls[2] is not None and not isinstance(calls[2], _CompiledBlockCall)

    class Cache:
        def layer_view(self, layer_idx: int) -> tuple[str, int]:
            return ("layer", layer_idx)

    seen = []
    call = _CompiledBlockCall(lambda *args, **kwargs: seen.append((args, kwargs)), layer_idx=1)
    call("hidden", cache=Cache(), use_cache=True)
    call("hidden", cache=None)
    assert seen == [(("hidden",), {"cache": ("layer", 1), "use_cache": True}), (("hidden",), {"cache": None})]


LOSS_SHAPES = {
    "a weight per row and column": (dict(loss_weights=torch.ones(2, 1)), r"loss_weights: one per sample, shape \(2,\), "
                                                                          r"got \(2, 1\)"),
    "one weight for the batch": (dict(loss_weights=torch.ones(1)), r"loss_weights: one per sample, shape \(2,\), got \(1,\)"),
    "a float weight": (dict(loss_weights=2.0), r"loss_weights: one per sample, shape \(2,\), got 2\.0"),
    "longer logits": (dict(logits=torch.randn(2, 9, 11)), r"logits \(2, 9, 11\): \[batch, length, vocab\] for labels "
                                                          r"\(2, 6\)"),
    "logits of another batch": (dict(logits=torch.randn(3, 6, 11)), r"logits \(3, 6, 11\)"),
    "masked of another shape": (dict(masked=torch.ones(2, 5, dtype=torch.bool)), r"labels \(2, 6\) and masked \(2, 5\): "
                                                                                  r"both \[batch, length\]"),
    "no tokens to average over": (dict(num_items_in_batch=0), r"num_items_in_batch=0: the response tokens .* > 0"),
    "a negative count": (dict(num_items_in_batch=-3), r"num_items_in_batch=-3"),
}


@pytest.mark.parametrize("case", LOSS_SHAPES)
def test_the_loss_refuses_shapes_it_would_broadcast(case):
    """Broadcasting turned each of these into a plausible scalar (a [B, 1] weight into a B x B sum); the well-formed
    batch beside them gives the loss by hand."""
    from trims_hf.students.loss import mdlm_loss
    from trims_hf.students.registry import STUDENTS

    torch.manual_seed(0)
    spec = STUDENTS["llada"]
    batch = dict(logits=torch.randn(2, 6, 11), labels=torch.randint(0, 11, (2, 6)),
                 masked=torch.tensor([[0, 1, 1, 0, 0, 1], [1, 0, 0, 0, 1, 0]], dtype=torch.bool),
                 loss_weights=torch.tensor([2.0, 0.5]), num_items_in_batch=4)
    ce = torch.nn.functional.cross_entropy(batch["logits"][batch["masked"]], batch["labels"][batch["masked"]],
                                           reduction="none")
    expected = (2.0 * ce[:3].sum() + 0.5 * ce[3:].sum()) / 4
    assert torch.allclose(mdlm_loss(spec=spec, **batch), expected)
    changed, message = LOSS_SHAPES[case]
    with pytest.raises(ValueError, match=message):
        mdlm_loss(spec=spec, **{**batch, **changed})
