"""LLaDA 2.x (``LLaDA2MoeModelLM``): the native port against the reference of the original code, and its config."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers_students import LLADA2_TINY, LLADA2_TINY_BLOCK, MASK_ID, block_causal
from original_reference import load_reference
from safetensors.torch import load_file

from trims_hf import MaskingConfig, MDLMConfig, MDLMTrainer, TrimsDataCollator, load_student
from trims_hf.students import STUDENTS, detect_student_kind
from trims_hf.students.block_diffusion import block_diffusion_inputs, block_diffusion_mask, clean_input_ids
from trims_hf.students.llada2 import glm4_moe_config_from_llada2, llada2_config_from_glm4_moe


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


def test_experts_run_transformers_grouped_gemm_with_the_per_expert_loops_logits(llada2):
    """The grouped GEMM (transformers' default for GLM-4-MoE) rather than a Python loop over every expert: the loop made
    an H100 forward of LLaDA2.0-mini 66x its weight-read bound (docs/gpu.md)."""
    parity = load_file(llada2 / "parity.safetensors")
    model = load_student(str(llada2)).eval()
    assert model.config._experts_implementation == "grouped_mm"
    with torch.no_grad():
        grouped = model(input_ids=parity["input_ids"]).logits
        model.set_experts_implementation("eager")
        looped = model(input_ids=parity["input_ids"]).logits
    torch.testing.assert_close(grouped, looped, atol=1e-5, rtol=0)


def test_hub_config_is_detected_and_lora_wraps_the_original_projections(llada2):
    assert detect_student_kind({"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"]}) == "llada2"
    assert detect_student_kind({"model_type": "llada21_moe"}) == "llada2"  # dLLM's name for LLaDA 2.1's copy
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


def dfactory_mask(length: int, block: int) -> torch.Tensor:
    """dFactory ``tasks/train_llada2_bd.py::block_diffusion_mask`` as written there: one (query, key) pair at a time."""
    allowed = torch.zeros(2 * length, 2 * length, dtype=torch.bool)
    for q in range(2 * length):
        for kv in range(2 * length):
            q_clean, kv_clean = q >= length, kv >= length
            block_q, block_kv = (q - length if q_clean else q) // block, (kv - length if kv_clean else kv) // block
            allowed[q, kv] = ((block_q == block_kv and q_clean == kv_clean)
                              or (block_q > block_kv and kv_clean and not q_clean)
                              or (block_q >= block_kv and kv_clean and q_clean))
    return allowed


@pytest.mark.parametrize(("length", "block"), [(24, 8), (10, 4)])
def test_training_mask_is_dfactorys_block_diffusion_mask(length, block):
    assert torch.equal(block_diffusion_mask(length, block), dfactory_mask(length, block))


def test_a_noised_block_is_denoised_from_the_clean_blocks_before_it_as_the_decoder_sees_them(llada2):
    """The training forward's logits on noised block j equal a decoding forward's on [clean blocks < j, noised j]."""
    parity = load_file(llada2 / "parity.safetensors")
    noised = parity["input_ids"]
    clean = torch.randint(0, MASK_ID - 1, noised.shape, generator=torch.Generator().manual_seed(3))
    model = load_student(str(llada2)).eval()
    length, block = noised.shape[1], LLADA2_TINY_BLOCK
    with torch.no_grad():
        training = model(**block_diffusion_inputs(noised, clean, block)).logits[:, :length]
        for j in range(length // block):
            end = (j + 1) * block
            view = torch.cat([clean[:, : j * block], noised[:, j * block:end]], dim=1)
            decoding = model(input_ids=view, attention_mask=block_causal(end, block)).logits[:, j * block:end]
            torch.testing.assert_close(training[:, j * block:end], decoding, atol=1e-4, rtol=0)
        changed = clean.clone()
        changed[:, block:] = (changed[:, block:] + 1) % (MASK_ID - 1)  # every clean token after the first block
        first = model(**block_diffusion_inputs(noised, changed, block)).logits[:, :length]
    torch.testing.assert_close(first[:, : 2 * block], training[:, : 2 * block], atol=1e-5, rtol=0)
    assert (first[:, 2 * block:] - training[:, 2 * block:]).abs().max() > 1e-3


BLOCK = STUDENTS["llada2"].block_size


def trims_batch(collator: TrimsDataCollator) -> dict[str, torch.Tensor]:
    """Two rows of three LLaDA 2.x blocks (prompts of 5 and 3 tokens, buckets cycling 0..3), the second padded."""
    rows = [{"input_ids": [(7 * i + 3 * r) % 250 for i in range(length)], "prompt_length": prompt,
             "bucket_ids": [i % 4 for i in range(length - prompt)], "example_id": r}
            for r, (length, prompt) in enumerate([(3 * BLOCK, 5), (3 * BLOCK - 10, 3)])]
    return collator(rows)


@pytest.fixture
def trims_collator():
    tokenizer = SimpleNamespace(eos_token_id=254, mask_token_id=MASK_ID)
    masking = MaskingConfig(num_buckets=4, trajectory_ratio=1.0, p_context=0.0, p_future=1.0)
    return TrimsDataCollator(tokenizer, masking=masking, seed=0)  # a seed whose thresholds leave both rows masks


def test_trims_masks_the_future_buckets_in_the_noised_copy_and_keeps_the_clean_one(trims_collator):
    batch = trims_batch(trims_collator)
    clean = clean_input_ids(batch["input_ids"], batch["masked"], batch["labels"])
    inputs = block_diffusion_inputs(batch["input_ids"], clean, BLOCK, batch["attention_mask"])
    length = clean.shape[1]
    assert torch.equal(inputs["input_ids"][:, :length], batch["input_ids"])
    assert not (inputs["input_ids"][:, length:] == MASK_ID).any()  # x_0 holds every clean token
    assert torch.equal(inputs["position_ids"][:, :length], inputs["position_ids"][:, length:])
    for row, (prompt, response) in enumerate([(5, 3 * BLOCK - 5), (3, 3 * BLOCK - 13)]):
        padding = torch.full((length - prompt - response,), trims_collator.masking.end_bucket)  # trained EOS padding
        buckets = torch.cat([torch.arange(response) % 4, padding])
        masked = batch["masked"][row, prompt:]
        assert not batch["masked"][row, :prompt].any() and masked.any() and not masked.all()
        threshold = int(buckets[~masked].max())  # p_future = 1, p_context = 0: exactly the buckets above k
        assert torch.equal(masked, buckets > threshold)


def reference_objective(folder, batch: dict[str, torch.Tensor], block_diffusion: bool = True) -> torch.Tensor:
    """The original trainer's objective on the original model: dFactory's forward over [x_t | x_0] with its mask and
    repeated positions, cross-entropy of the x_t logits at the masked positions, weighted per sample, over the tokens
    (``block_diffusion=False``: the fully bidirectional MDLM forward over x_t alone, for contrast)."""
    reference = load_reference(str(folder), "llada2")
    noised, masked, labels = batch["input_ids"], batch["masked"], batch["labels"]
    length = noised.shape[1]
    clean = torch.where(masked, labels, noised)
    positions = torch.arange(length).repeat(2).expand(len(noised), -1)
    with torch.no_grad():
        logits = (reference(torch.cat([noised, clean], 1), dfactory_mask(length, BLOCK)[None, None], positions)[:, :length]
                  if block_diffusion else reference(noised))
    token_loss = F.cross_entropy(logits[masked], labels[masked], reduction="none")
    weights = batch["loss_weights"][:, None].expand_as(masked)[masked]
    return (token_loss * weights).sum() / (labels != -100).sum()


def test_trainer_and_plain_trainer_losses_are_the_original_block_diffusion_objective(llada2, trims_collator, tmp_path):
    collator = replace(trims_collator, masking=replace(trims_collator.masking, p_context=0.3, p_future=0.9))
    batch = trims_batch(collator)
    model = load_student(str(llada2))
    expected = reference_objective(llada2, batch)
    with torch.no_grad():
        plain = model(**batch).loss  # the plain transformers.Trainer path (forward hooks)
        trainer = MDLMTrainer(model, MDLMConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[]), data_collator=collator)
        ours = trainer.compute_loss(model, batch)
    torch.testing.assert_close(plain, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    assert abs(float(expected) - float(reference_objective(llada2, batch, block_diffusion=False))) > 1e-3


def test_padding_is_invisible_to_the_real_tokens_of_a_row(llada2, trims_collator):
    collator = replace(trims_collator, masking=replace(trims_collator.masking, train_on_padding=False))
    batch = trims_batch(collator)
    real = int(batch["attention_mask"][1].sum())
    assert real < batch["input_ids"].shape[1]  # the second row is padded
    model = load_student(str(llada2)).eval()
    clean = clean_input_ids(batch["input_ids"], batch["masked"], batch["labels"])
    with torch.no_grad():
        padded = model(**block_diffusion_inputs(batch["input_ids"], clean, BLOCK, batch["attention_mask"])).logits
        alone = model(**block_diffusion_inputs(batch["input_ids"][1:, :real], clean[1:, :real], BLOCK)).logits
    length = clean.shape[1]
    torch.testing.assert_close(padded[1:, :real], alone[:, :real], atol=1e-4, rtol=0)
    assert torch.isfinite(padded[1, real:length]).all()


def test_initialised_from_its_config_it_is_the_fused_qkv_class(llada2):
    from trims_hf.model_config import resolve_student
    from trims_hf.training.train_job import ModelArguments, build_student

    scratch = ModelArguments(str(llada2), init_from_config=True)
    model = build_student(scratch, resolve_student(scratch, tokenizer=SimpleNamespace(mask_token_id=MASK_ID)))
    assert type(model).__name__ == "LLaDA2ForCausalLM"
    assert "model.layers.0.self_attn.query_key_value.weight" in model.state_dict()


def test_an_attention_that_cannot_take_the_block_mask_is_refused(llada2):
    from trims_hf import prepare_student

    model = load_student(str(llada2))
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation='flex_attention'"):
        prepare_student(model, "llada2")
    assert load_student(str(llada2), attn_implementation="eager").config._attn_implementation == "eager"


def test_harness_elbo_is_the_block_diffusion_elbo_of_the_original_model(llada2):
    """lm-eval's Monte Carlo ELBO terms read each noised block given the clean blocks before it, as training does."""
    from trims_hf.evaluation.harness.likelihood import masked_elbo_terms, sample_mask_patterns

    context, continuation = list(range(3, 3 + BLOCK - 4)), list(range(40, 40 + 20))  # the continuation spans 2 blocks
    masks = sample_mask_patterns(len(continuation), 4, torch.Generator().manual_seed(0))
    terms = masked_elbo_terms(load_student(str(llada2)).eval(), context, continuation, masks)
    sequence = torch.tensor(context + continuation)
    target = sequence[len(context):].expand(len(masks), -1)
    noisy = sequence.repeat(len(masks), 1)
    noisy[:, len(context):] = torch.where(masks, MASK_ID, target)
    length = len(sequence)
    positions = torch.arange(length).repeat(2).expand(len(masks), -1)
    reference = load_reference(str(llada2), "llada2")
    with torch.no_grad():
        views = {"block diffusion": reference(torch.cat([noisy, sequence.expand_as(noisy)], 1),
                                              dfactory_mask(length, BLOCK)[None, None], positions)[:, :length],
                 "bidirectional": reference(noisy)}
    expected = {name: len(continuation) / masks.sum(1) * (logits[:, len(context):].log_softmax(-1).gather(
        -1, target[..., None])[..., 0] * masks).sum(1) for name, logits in views.items()}
    torch.testing.assert_close(terms, expected["block diffusion"], atol=1e-4, rtol=1e-5)
    assert (expected["block diffusion"] - expected["bidirectional"]).abs().max() > 1e-2


# The defaults of the original LLaDA2MoeConfig (dLLM dllm/pipelines/llada2/models/configuration_llada2_moe.py).
ORIGINAL_CLASS_DEFAULTS = {"partial_rotary_factor": 0.5, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
                           "rope_theta": 10000.0, "attention_dropout": 0.1}


@pytest.mark.parametrize("field", sorted(ORIGINAL_CLASS_DEFAULTS))
def test_a_missing_field_reads_as_the_original_config_classs_default(field):
    given = {**LLADA2_TINY, "num_experts": 16}  # 8 groups of 2 under the default n_group
    given.pop("rotary_dim")
    absent = {key: value for key, value in given.items() if key != field}
    explicit = {**given, field: ORIGINAL_CLASS_DEFAULTS[field]}
    assert glm4_moe_config_from_llada2(absent).to_dict() == glm4_moe_config_from_llada2(explicit).to_dict()


def test_a_config_without_partial_rotary_factor_has_the_original_logits(llada2, tmp_path):
    parity = load_file(llada2 / "parity.safetensors")
    folder = tmp_path / "no_factor"
    shutil.copytree(llada2, folder)
    config = json.loads((folder / "config.json").read_text())
    assert config.pop("partial_rotary_factor") == ORIGINAL_CLASS_DEFAULTS["partial_rotary_factor"]
    config.pop("rotary_dim")
    (folder / "config.json").write_text(json.dumps(config))
    with torch.no_grad():
        logits = load_student(str(folder)).eval()(input_ids=parity["input_ids"]).logits
    torch.testing.assert_close(logits, parity["logits"], atol=1e-4, rtol=0)


def test_attention_dropout_is_the_originals_in_training():
    assert glm4_moe_config_from_llada2({**LLADA2_TINY, "attention_dropout": 0.3}).attention_dropout == 0.3


def test_a_config_without_use_bias_means_a_bias_and_is_refused_in_one_line():
    with pytest.raises(ValueError, match="use_bias") as error:
        glm4_moe_config_from_llada2({key: value for key, value in LLADA2_TINY.items() if key != "use_bias"})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("edit", "field"), [
    ({"n_group": 0}, "n_group"), ({"n_group": 3}, "n_group"), ({"n_group": None}, "n_group"),  # default 8 of 8
    ({"n_group": 8, "topk_group": 4}, "n_group"),  # one expert per group: the group score is a top-2 sum
    ({"topk_group": 0}, "topk_group"), ({"topk_group": 5}, "topk_group"), ({"n_group": 2, "topk_group": None}, "topk_group"),
    ({"topk_group": 1, "num_experts_per_tok": 3}, "num_experts_per_tok"),  # 1 group of 2 experts
    ({"num_key_value_heads": 3}, "num_key_value_heads"),  # 4 query heads
])
def test_a_router_the_original_cannot_run_is_refused_at_load_naming_the_field(edit, field):
    config = {**LLADA2_TINY, **edit}
    config = {key: value for key, value in config.items() if value is not None}
    with pytest.raises(ValueError, match=f"field {field}=") as error:
        glm4_moe_config_from_llada2(config)
    assert "\n" not in str(error.value)


def test_the_saved_config_writes_the_fields_the_original_would_default():
    original = {key: value for key, value in LLADA2_TINY.items()
                if key not in ("use_bias", "partial_rotary_factor", "rotary_dim", "rope_theta", "attention_dropout",
                               "routed_scaling_factor")}
    glm = glm4_moe_config_from_llada2({**original, "use_bias": False})
    saved = llada2_config_from_glm4_moe(glm, original)
    assert saved["use_bias"] is False
    assert {key: saved[key] for key in ("partial_rotary_factor", "rope_theta", "attention_dropout",
                                        "routed_scaling_factor")} == {
        "partial_rotary_factor": 0.5, "rope_theta": 10000.0, "attention_dropout": 0.1, "routed_scaling_factor": 2.5}
    assert glm4_moe_config_from_llada2(saved).to_dict() == glm.to_dict()
    assert llada2_config_from_glm4_moe(glm4_moe_config_from_llada2(LLADA2_TINY), LLADA2_TINY) == LLADA2_TINY


def test_dfactorys_model_type_is_detected_and_loads(llada2, tmp_path):
    assert detect_student_kind({**LLADA2_TINY, "model_type": "llada2_moe_veomni"}) == "llada2"
    folder = tmp_path / "veomni"
    shutil.copytree(llada2, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "llada2_moe_veomni"}))
    parity = load_file(llada2 / "parity.safetensors")
    with torch.no_grad():
        logits = load_student(str(folder)).eval()(input_ids=parity["input_ids"]).logits
    torch.testing.assert_close(logits, parity["logits"], atol=1e-4, rtol=0)
