"""``trims train``: the toy recipe end to end, overrides, unknown keys, the paper recipes, resume reproducibility.

Run as a script to build the toy recipe's inputs: ``python tests/test_train_cli.py outputs/toy``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import LlamaConfig

from conftest import synthetic_scored_rows
from helpers_tokenizers import make_tokenizer
from trims_hf.cli import main
from trims_hf.jobs.train import RecipeError, parse_recipe, read_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TOY = RECIPES / "toy" / "trims_toy.yaml"


def arithmetic_rows(count: int = 64) -> list[dict]:
    """Self-contained toy prompts and completions (no data set download)."""
    rows = []
    for i in range(count):
        a, b = 3 * i % 17 + 2, 7 * i % 23 + 1
        rows.append({"prompt": f"What is {a} plus {b}?", "completion": f"{a} plus {b} is {a + b}. The answer is {a + b}."})
    return rows


def write_toy_assets(folder: Path) -> tuple[Path, Path]:
    """Write the toy student (tokenizer + tiny Llama config, no weights) and a scored data set folder."""
    rows = arithmetic_rows()
    tokenizer = make_tokenizer([r["prompt"] + "\n" + r["completion"] for r in rows], vocab_size=300)
    student = folder / "student"
    LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id).save_pretrained(student)
    tokenizer.save_pretrained(student)
    scored = folder / "scored"
    (scored / "data").mkdir(parents=True, exist_ok=True)
    Dataset.from_list(synthetic_scored_rows(rows, tokenizer)).to_parquet(str(scored / "data" / "train-00000-of-00001.parquet"))
    return student, scored


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> list[str]:
    """Overrides pointing the toy recipe at freshly written inputs."""
    student, scored = write_toy_assets(tmp_path_factory.mktemp("toy"))
    return ["--model_name_or_path", str(student), "--dataset_name", str(scored), "--init_from_config", "true", "--model_kind", "llada"]


def train_cli(toy: list[str], output_dir: Path, *overrides: str) -> int:
    return main(["train", "--config", str(TOY), *toy, "--output_dir", str(output_dir), *overrides])


def test_toy_recipe_end_to_end(tmp_path, toy):
    assert train_cli(toy, tmp_path, "--max_steps", "3") == 0
    assert (tmp_path / "adapter_model.safetensors").exists() and (tmp_path / "adapter_config.json").exists()
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert state["global_step"] == 3 and len(losses) == 3 and all(loss > 0 for loss in losses)
    card = (tmp_path / "README.md").read_text()
    assert "library_name: peft" in card and "trajectory_ratio" in card


def test_overrides_win_and_are_typed():
    model_args, data_args, args = parse_recipe(TOY, ["--num_buckets", "4", "--bucket_ordering", "easy_to_hard",
                                                     "--lora_r", "4", "--metric", "entropy"])
    assert (args.num_buckets, args.bucket_ordering, model_args.lora_r, args.metric) == (4, "easy_to_hard", 4, "entropy")
    assert args.learning_rate == pytest.approx(3e-3) and args.lr_scheduler_type == "cosine"  # from the YAML
    assert not model_args.init_from_config and data_args.dataset_name == "outputs/toy/scored"


def test_unknown_keys_are_errors(tmp_path, toy, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TOY.read_text() + "lerning_rate: 0.1\n")
    with pytest.raises(RecipeError, match=r"'lerning_rate'.*bad\.yaml"):
        read_recipe(bad)
    assert main(["train", "--config", str(bad)]) == 2
    assert "lerning_rate" in capsys.readouterr().err
    assert train_cli(toy, tmp_path / "out", "--num_bukets", "4") == 2
    assert "--num_bukets" in capsys.readouterr().err
    assert train_cli(toy, tmp_path / "out", "--num_bucket", "4") == 2  # abbreviations never silently set a key
    assert "--num_bucket" in capsys.readouterr().err


PAPER = {"max_length": 1024, "num_train_epochs": 30, "learning_rate": 1e-4, "lr_scheduler_type": "cosine",
         "warmup_steps": 0.03, "weight_decay": 0.1, "lora_r": 32, "lora_alpha": 32, "bf16": True, "num_buckets": 8,
         "p_context": 0.05, "p_future": 0.95, "bucket_ordering": "hard_to_easy", "metric": "nll",
         "per_device_train_batch_size": 1, "gradient_accumulation_steps": 4}


@pytest.mark.parametrize("student", ["llada", "dream"])
def test_paper_recipes(student):
    trims, mdlm = read_recipe(RECIPES / student / "trims_s1k.yaml"), read_recipe(RECIPES / student / "mdlm_s1k.yaml")
    model_args, _, args = parse_recipe(RECIPES / student / "trims_s1k.yaml", ["--bf16", "false", "--use_cpu", "true"])
    assert model_args.model_kind == student
    values = {**trims, "learning_rate": args.learning_rate}
    assert {key: values[key] for key in PAPER} == PAPER
    assert trims["trajectory_ratio"] == 0.1 and mdlm["trajectory_ratio"] == 0
    differ = {key for key in trims.keys() | mdlm.keys() if trims.get(key) != mdlm.get(key)}
    assert differ == {"trajectory_ratio", "output_dir"}


def adapter_and_losses(folder: Path) -> tuple[dict[str, torch.Tensor], list[float]]:
    state = json.loads((folder / "trainer_state.json").read_text())
    return load_file(folder / "adapter_model.safetensors"), [e["loss"] for e in state["log_history"] if "loss" in e]


def test_resume_reproduces_a_straight_run(tmp_path, toy):
    """6 steps straight == 3 steps, then resume from checkpoint-3 for 3 more (crossing an epoch boundary)."""
    common = ("--per_device_train_batch_size", "16", "--lr_scheduler_type", "constant", "--warmup_steps", "0",
              "--lora_dropout", "0.1", "--trajectory_ratio", "0.5")  # dropout and trajectory draws exercise RNG state
    assert train_cli(toy, tmp_path / "straight", *common, "--max_steps", "6", "--save_strategy", "no") == 0
    assert train_cli(toy, tmp_path / "split", *common, "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "3") == 0
    assert train_cli(toy, tmp_path / "split", *common, "--max_steps", "6", "--save_strategy", "no",
                     "--resume_from_checkpoint", str(tmp_path / "split" / "checkpoint-3")) == 0
    straight, straight_losses = adapter_and_losses(tmp_path / "straight")
    resumed, resumed_losses = adapter_and_losses(tmp_path / "split")
    assert len(straight_losses) == 6 and resumed_losses == straight_losses
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name

