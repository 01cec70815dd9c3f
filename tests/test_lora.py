"""LoRA helper: targets, the LM head left alone, adapters save and reload to identical logits, the MDLM loss
through PEFT."""

from __future__ import annotations

import shutil
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import FIXTURES, synthetic_scored_rows, tiny_student
from datasets import Dataset
from peft import PeftModel, get_peft_model

from trims_hf import (
    AdapterError,
    MDLMConfig,
    MDLMTrainer,
    TrimsDataCollator,
    load_adapter,
    load_student,
    lora_config,
    per_sample_loss,
    prepare_dataset,
    prepare_student,
    student_spec,
)
from trims_hf.students.adapters import BASE_FINGERPRINT


def test_lora_targets_projections_not_head():
    model = load_student(str(FIXTURES / "llada_tiny"))
    config = lora_config(model)
    assert config.r == 32 and config.lora_alpha == 32
    peft_model = get_peft_model(model, config)
    wrapped = {name for name, module in peft_model.named_modules() if hasattr(module, "lora_A")}
    assert any(name.endswith("self_attn.o_proj") for name in wrapped)
    assert any(name.endswith("mlp.down_proj") for name in wrapped)  # LLaDA's block ff_out
    assert not any("lm_head" in name for name in wrapped)  # LLaDA's transformer.ff_out


def test_task_type_follows_generation_support(tokenizer):
    assert lora_config(tiny_student(tokenizer, "dream")).task_type == "CAUSAL_LM"
    bert = tiny_student(tokenizer, "masked_lm")
    config = lora_config(bert)
    assert config.task_type is None and config.target_modules == "all-linear"


@pytest.mark.slow
def test_adapter_save_and_reload(tmp_path, tokenizer, gsm8k_rows):
    model = get_peft_model(tiny_student(tokenizer, "dream", seed=3),
                           lora_config(tiny_student(tokenizer, "dream", seed=3), r=4, lora_alpha=8))
    args = MDLMConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, max_steps=3, learning_rate=1e-2,
                      report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True)
    trainer = MDLMTrainer(model, args, train_dataset=Dataset.from_list(synthetic_scored_rows(gsm8k_rows[:12], tokenizer)),
                          processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert "adapter_model.safetensors" in files and "model.safetensors" not in files
    reloaded = PeftModel.from_pretrained(tiny_student(tokenizer, "dream", seed=3), str(tmp_path / "adapter"))
    ids = torch.randint(3, len(tokenizer), (2, 16))
    model.eval()
    with torch.no_grad():
        trained = model(input_ids=ids).logits
        again = reloaded(input_ids=ids).logits
        base = tiny_student(tokenizer, "dream", seed=3)(input_ids=ids).logits
    assert torch.equal(trained, again)
    assert not torch.allclose(trained, base)  # the adapter learned something
    # The saved adapter records its base's weights: the same base loads it, another of the same shapes is refused.
    assert (tmp_path / "adapter" / BASE_FINGERPRINT).is_file()
    assert load_adapter(tiny_student(tokenizer, "dream", seed=3), str(tmp_path / "adapter")) is not None
    with pytest.raises(AdapterError, match=r"trained on a base with other weights than this model: \d+ of \d+ sampled"):
        load_adapter(tiny_student(tokenizer, "dream", seed=4), str(tmp_path / "adapter"))
    assert load_adapter(tiny_student(tokenizer, "dream", seed=4), str(tmp_path / "adapter"), allow_base_mismatch=True)


@pytest.mark.slow
def test_the_base_record_is_the_base_as_the_trainer_got_it(tmp_path, tokenizer, gsm8k_rows):
    """The record is taken when the trainer is built: a base weight trained beside the adapter (which does not save
    it) is recorded as it came, so the adapter goes back on the base it came from; weights sharded after that, as
    FSDP and ZeRO-3 shard them inside train, are still recorded; weights that came partitioned record nothing."""
    def lora_student(seed: int) -> PeftModel:
        return get_peft_model(tiny_student(tokenizer, "dream", seed=seed),
                              lora_config(tiny_student(tokenizer, "dream", seed=seed), r=4, lora_alpha=8))

    def args(folder: str) -> MDLMConfig:
        return MDLMConfig(output_dir=str(tmp_path / folder), per_device_train_batch_size=4, max_steps=3,
                          learning_rate=1e-2, report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True)

    model = lora_student(3)
    norm = model.get_base_model().model.norm.weight
    norm.requires_grad_(True)
    trainer = MDLMTrainer(model, args("run"), processing_class=tokenizer,
                          train_dataset=Dataset.from_list(synthetic_scored_rows(gsm8k_rows[:12], tokenizer)))
    trainer.train()
    assert not torch.equal(norm, tiny_student(tokenizer, "dream", seed=3).model.norm.weight)  # it trained
    for parameter in model.parameters():
        parameter.ds_id = 0  # partitioned, as ZeRO-3 leaves them
    trainer.save_model(str(tmp_path / "adapter"))
    assert load_adapter(tiny_student(tokenizer, "dream", seed=3), str(tmp_path / "adapter")) is not None
    with pytest.raises(AdapterError, match="trained on a base with other weights"):
        load_adapter(tiny_student(tokenizer, "dream", seed=4), str(tmp_path / "adapter"))

    partitioned = lora_student(3)
    for parameter in partitioned.parameters():
        parameter.ds_id = 0
    shutil.copytree(tmp_path / "adapter", tmp_path / "partitioned")  # an earlier run's adapter and record
    MDLMTrainer(partitioned, args("partitioned"), processing_class=tokenizer).save_model(str(tmp_path / "partitioned"))
    assert (tmp_path / "partitioned" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "partitioned" / BASE_FINGERPRINT).exists()  # the earlier record is not this adapter's

    trainer.model = torch.nn.DataParallel(model)  # wrapped, as DDP, FSDP or DeepSpeed wrap it inside train
    trainer.save_model(str(tmp_path / "wrapped"))
    record = (tmp_path / "wrapped" / BASE_FINGERPRINT).read_text()
    assert record == (tmp_path / "adapter" / BASE_FINGERPRINT).read_text()  # the base's, sampled when built
    trainer.model = other = lora_student(4)  # another model set on the trainer: its own base recorded
    trainer.save_model(str(tmp_path / "other"))
    assert load_adapter(tiny_student(tokenizer, "dream", seed=4), str(tmp_path / "other")) is not None
    with pytest.raises(AdapterError, match="trained on a base with other weights"):
        load_adapter(tiny_student(tokenizer, "dream", seed=3), str(tmp_path / "other"))
    trainer.model = other.merge_and_unload()  # no adapter any more: full weights, no record beside them
    trainer.save_model(str(tmp_path / "merged"))
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert not (tmp_path / "merged" / BASE_FINGERPRINT).exists()


def test_a_push_during_training_uploads_the_base_record(tmp_path, tokenizer, gsm8k_rows, monkeypatch):
    """The Trainer pushes each checkpoint by copying the model's files into output_dir and uploading that folder:
    the record goes along with the adapter (offline: the Hub client replaced by one that lists what it uploads)."""
    uploads: list[list[str]] = []

    class Hub:
        def create_repo(self, repo_id: str, **kwargs: object) -> SimpleNamespace:
            return SimpleNamespace(repo_id=repo_id)

        def upload_folder(self, folder_path: str, **kwargs: object) -> Future:
            uploads.append(sorted(path.name for path in Path(folder_path).iterdir()))
            done = Future()
            done.set_result("uploaded")
            return done

    monkeypatch.setattr("transformers.trainer.hf_api", Hub)
    model = get_peft_model(tiny_student(tokenizer, "dream", seed=3),
                           lora_config(tiny_student(tokenizer, "dream", seed=3), r=4, lora_alpha=8))
    args = MDLMConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, max_steps=2, report_to="none",
                      use_cpu=True, save_strategy="steps", save_steps=1, disable_tqdm=True, push_to_hub=True,
                      hub_model_id="me/student", hub_strategy="every_save", hub_token="hf_fake")
    MDLMTrainer(model, args, processing_class=tokenizer,
                train_dataset=Dataset.from_list(synthetic_scored_rows(gsm8k_rows[:8], tokenizer))).train()
    assert len(uploads) == 2
    assert all({"adapter_model.safetensors", BASE_FINGERPRINT} <= set(files) for files in uploads)
    # A checkpoint without a record (weights that came partitioned) uploads none, not an earlier one left there.
    bare = tmp_path / "run" / "checkpoint-bare"
    shutil.copytree(tmp_path / "run" / "checkpoint-2", bare)
    (bare / BASE_FINGERPRINT).unlink()
    trainer = MDLMTrainer(model, args, processing_class=tokenizer)
    trainer._push_from_checkpoint(str(bare))
    assert "adapter_model.safetensors" in uploads[-1] and BASE_FINGERPRINT not in uploads[-1]


def test_peft_student_returns_the_mdlm_loss_on_a_collator_batch(tokenizer, gsm8k_rows):
    """What a plain Trainer sees through PEFT: model(**batch, num_items_in_batch=N).loss is the MDLM loss / N."""
    student = tiny_student(tokenizer, "dream")
    prepare_student(student, "dream")  # preparing again keeps one pair of hooks
    assert len(student._forward_hooks) == len(student._forward_pre_hooks) == 1
    model = get_peft_model(student, lora_config(student, r=4))
    rows = list(prepare_dataset(Dataset.from_list(synthetic_scored_rows(gsm8k_rows[:4], tokenizer)), tokenizer))
    batch = TrimsDataCollator(tokenizer)(rows)
    with torch.no_grad():
        loss = model(**batch, num_items_in_batch=torch.tensor(1000)).loss
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        plain = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
    expected = per_sample_loss(logits, batch["labels"], batch["masked"], batch["loss_weights"], student_spec(student))
    assert loss.item() == pytest.approx(expected.sum().item() / 1000, rel=1e-5)
    assert plain.item() != pytest.approx(loss.item(), rel=1e-2)  # labels alone: the model's own causal loss
