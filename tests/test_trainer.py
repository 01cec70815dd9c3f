"""MDLMTrainer: the loss against a hand-computed reference, GA/batch equivalence, Dream shift, training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import TrainingArguments

from conftest import noised_batch, synthetic_scored_rows, tiny_student
from trims_hf import MDLMConfig, MDLMTrainer, TrimsDataCollator, prepare_dataset


def make_args(tmp_path, **overrides) -> MDLMConfig:
    defaults = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=1e-3, max_steps=1,
                    logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
                    lr_scheduler_type="constant", optim="sgd", weight_decay=0.0)
    return MDLMConfig(**(defaults | overrides))


@pytest.fixture(scope="module")
def scored(gsm8k_rows, tokenizer):
    return synthetic_scored_rows(gsm8k_rows, tokenizer)


@pytest.fixture(scope="module")
def prepared(scored, tokenizer):
    return list(prepare_dataset(Dataset.from_list(scored), tokenizer))


def reference_loss(model, batch, shift: bool, normalization: str = "token") -> torch.Tensor:
    """The MDLM/TRIMS objective written out position by position."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    total = torch.zeros(())
    for b in range(logits.shape[0]):
        sample = torch.zeros(())
        for i in range(logits.shape[1]):
            label = int(batch["labels"][b, i])
            if label == -100:
                continue
            source = max(i - 1, 0) if shift else i
            sample = sample + F.cross_entropy(logits[b, source].float(), torch.tensor(label))
        sample = sample * batch["loss_weights"][b]
        if normalization == "sequence":
            sample = sample / batch["response_mask"][b].sum()
        total = total + sample
    denominator = batch["response_mask"].sum() if normalization == "token" else logits.shape[0]
    return total / denominator


@pytest.mark.parametrize("kind,normalization", [("llada", "token"), ("dream", "token"), ("llada", "sequence"),
                                                ("masked_lm", "token")])
def test_loss_matches_reference(tmp_path, tokenizer, scored, prepared, kind, normalization):
    model = tiny_student(tokenizer, kind)
    trainer = MDLMTrainer(model, make_args(tmp_path, loss_normalization=normalization, trajectory_ratio=0.5),
                          train_dataset=Dataset.from_list(scored), processing_class=tokenizer)
    batch = trainer.data_collator(prepared[:6])
    assert batch["is_trajectory"].any() and (~batch["is_trajectory"]).any()
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch)
        expected = reference_loss(model, batch, shift=(kind == "dream"), normalization=normalization)
    assert torch.allclose(loss, expected, rtol=1e-5), (loss, expected)


def test_dream_shift_reads_previous_position(tmp_path, tokenizer, scored, prepared):
    model = tiny_student(tokenizer, "dream")
    trainer = MDLMTrainer(model, make_args(tmp_path), processing_class=tokenizer)
    batch = trainer.data_collator(prepared[:2])
    with torch.no_grad():
        shifted = trainer.compute_loss(model, batch)
        unshifted = reference_loss(model, batch, shift=False)
        expected = reference_loss(model, batch, shift=True)
    assert torch.allclose(shifted, expected, rtol=1e-5)
    assert not torch.allclose(shifted, unshifted, rtol=1e-3)


class FixedBatches:
    """Collator returning rows of one pre-noised batch, so different batchings see identical samples."""

    def __init__(self, batch):
        self.batch = batch

    def __call__(self, features):
        index = torch.tensor([f["row"] for f in features])
        return {key: value[index] for key, value in self.batch.items()}


def one_step_parameters(tmp_path, tokenizer, batch, per_device: int, accumulation: int, accepts_kwargs: bool):
    model = tiny_student(tokenizer, "llada", seed=1)
    args = make_args(tmp_path, per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation)
    trainer = MDLMTrainer(model, args, data_collator=FixedBatches(batch),
                          train_dataset=Dataset.from_dict({"row": list(range(len(batch["t"])))}))
    trainer.model_accepts_loss_kwargs = accepts_kwargs
    trainer.train()
    loss = trainer.state.log_history[0]["loss"]
    return loss, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_gradient_accumulation_equals_large_batch(tmp_path, tokenizer, scored):
    batch = noised_batch(tokenizer, scored[:32], seed=5, trajectory_ratio=0.3)
    loss_big, params_big = one_step_parameters(tmp_path / "a", tokenizer, batch, 32, 1, True)
    for accepts_kwargs in (True, False):  # LLaDA's forward takes no **kwargs, Dream's does
        loss_ga, params_ga = one_step_parameters(tmp_path / "b", tokenizer, batch, 8, 4, accepts_kwargs)
        assert loss_ga == pytest.approx(loss_big, rel=1e-4)
        assert torch.allclose(params_ga, params_big, atol=1e-6)
    start = torch.cat([p.detach().flatten() for p in tiny_student(tokenizer, "llada", seed=1).parameters()])
    assert not torch.allclose(start, params_big)  # the step did move the weights


def test_training_reduces_loss_and_logs_metrics(tmp_path, tokenizer, scored):
    model = tiny_student(tokenizer, "llada", hidden=64)
    args = make_args(tmp_path, max_steps=40, learning_rate=3e-3, optim="adamw_torch", logging_steps=10,
                     trajectory_ratio=0.3, max_length=512)
    trainer = MDLMTrainer(model, args, train_dataset=Dataset.from_list(scored), eval_dataset=Dataset.from_list(scored[:16]),
                          processing_class=tokenizer)
    before = trainer.evaluate()["eval_loss"]  # masks are a function of the rows: the same eval batches both times
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < 0.75 * before, (before, after)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    for entry in logs:
        assert 0.2 < entry["mask_ratio"] < 0.8
        assert 0.0 <= entry["trajectory_share"] <= 1.0
        assert "loss_standard" in entry
    assert any("loss_trajectory" in entry for entry in logs)
    shares = [entry["trajectory_share"] for entry in logs]
    assert 0.1 < sum(shares) / len(shares) < 0.5  # ratio 0.3 with 80 samples per log window


def test_plain_training_arguments_keep_score_columns(tmp_path, tokenizer, scored):
    """remove_unused_columns=True (the Trainer default) must not strip the collator's columns."""
    model = tiny_student(tokenizer, "llada")
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, report_to="none",
                             use_cpu=True, save_strategy="no", remove_unused_columns=True, disable_tqdm=True)
    collator = TrimsDataCollator(tokenizer)
    dataset = Dataset.from_list(scored).add_column("unrelated", list(range(len(scored))))
    trainer = MDLMTrainer(model, args, data_collator=collator, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 2


def test_evaluation_reports_loss_and_metrics(tmp_path, tokenizer, scored):
    model = tiny_student(tokenizer, "dream")
    trainer = MDLMTrainer(model, make_args(tmp_path, per_device_eval_batch_size=8), eval_dataset=Dataset.from_list(scored[:16]),
                          processing_class=tokenizer)
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] > 0 and 0 < metrics["eval_mask_ratio"] < 1
    trainer.data_collator.epoch = 5  # as during training: evaluation keeps its own, fixed masks
    assert trainer.evaluate()["eval_loss"] == pytest.approx(metrics["eval_loss"], rel=1e-6)
    assert trainer.data_collator.epoch == 5


def test_unprepared_model_is_rejected(tmp_path, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    plain = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(ValueError, match="prepare_student"):
        MDLMTrainer(plain, make_args(tmp_path), processing_class=tokenizer)


def test_sequence_mode_logs_per_sequence_losses(tmp_path, tokenizer, scored, prepared):
    model = tiny_student(tokenizer, "llada")
    trainer = MDLMTrainer(model, make_args(tmp_path, loss_normalization="sequence", trajectory_ratio=0.0),
                          processing_class=tokenizer)
    batch = trainer.data_collator(prepared[:4])
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch)
    model.train()
    metrics = trainer._pop_metrics("train")
    assert metrics["loss_standard"] == pytest.approx(loss.item(), rel=1e-5)  # all standard: same normaliser
