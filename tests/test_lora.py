"""LoRA helper: targets, the LM head left alone, adapters save and reload to identical logits."""

from __future__ import annotations

import torch
from datasets import Dataset
from peft import PeftModel, get_peft_model

from conftest import SHARED, synthetic_scored_rows, tiny_student
from trims_hf import MDLMConfig, MDLMTrainer, lora_config, load_student


def test_lora_targets_projections_not_head():
    model = load_student(str(SHARED / "fixtures" / "llada_tiny"))
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


def test_adapter_save_and_reload(tmp_path, tokenizer, gsm8k_rows):
    model = get_peft_model(tiny_student(tokenizer, "dream", seed=3), lora_config(tiny_student(tokenizer, "dream", seed=3), r=4, lora_alpha=8))
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
