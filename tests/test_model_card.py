"""Model card content and metadata, and the Hub access check that runs before training (all offline)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from transformers.trainer_utils import SchedulerType

import trims_hf.data.hub as hub
from trims_hf.cli import main
from trims_hf.commands.eval import parser as eval_parser
from trims_hf.reports import library_versions
from trims_hf.settings import DecodingConfig, ResponseFormat
from trims_hf.training.model_card import eval_command, evaluation_from_logs, fitting_decoder, trims_model_card

TOY = Path(__file__).resolve().parents[1] / "recipes" / "toy" / "trims_toy.yaml"
HYPERPARAMETERS = {"TRIMS": {"num_buckets": 8, "p_context": 0.05, "p_future": 0.95, "trajectory_ratio": 0.1},
                   "LoRA": {"r": 32, "alpha": 32}}


LOGS = [{"loss": 2.5, "step": 5}, {"eval_gsm8k_accuracy": 0.5, "eval_loss": 1.0, "step": 5},
        {"loss": 1.25, "step": 10},
        {"eval_gsm8k_accuracy": 0.75, "eval_gsm8k_num_samples": 8.0, "eval_gsm8k_tokens_per_step": 2.5, "step": 10},
        {"train_loss": 1.875, "train_runtime": 3.0, "step": 10}]
DECODING = DecodingConfig(threshold=0.8, gen_length=64, block_length=16, cache="dual", early_stop=False)


def test_card_content_and_metadata(tmp_path):
    assert evaluation_from_logs(LOGS) == {"gsm8k": {"accuracy": 0.75, "num_samples": 8.0, "tokens_per_step": 2.5}}
    hyper = {**HYPERPARAMETERS, "optimisation": {"lr_scheduler_type": SchedulerType.COSINE, "learning_rate": 1e-4}}
    card = trims_model_card(base_model="GSAI-ML/LLaDA-8B-Instruct", base_model_revision="abc123",
                            dataset="me/s1K-trims", hyperparameters=hyper, log_history=LOGS, decoding=DECODING,
                            eval_data_file="data/gsm8k.jsonl", model_name="me/llada-trims")
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    data = loaded.data.to_dict()
    assert data["base_model"] == "GSAI-ML/LLaDA-8B-Instruct" and data["datasets"] == ["me/s1K-trims"]
    assert data["library_name"] == "peft" and {"trims", "mdlm"} <= set(data["tags"])
    trims = data["trims"]
    assert trims["base_model_revision"] == "abc123" and trims["TRIMS"]["p_future"] == 0.95
    assert trims["optimisation"]["lr_scheduler_type"] == "cosine"  # the enum's value, not SchedulerType.COSINE
    assert trims["training"] == {"final_train_loss": 1.25, "final_step": 10, "mean_train_loss": 1.875}
    assert trims["versions"] == library_versions() and trims["decoding"]["threshold"] == 0.8
    metrics = [m for result in data["model-index"][0]["results"] for m in result["metrics"]]
    assert {(m["type"], m["value"]) for m in metrics} == {("accuracy", 0.75), ("tokens_per_step", 2.5)}
    text = loaded.text
    assert "| task | accuracy (%) | n | tokens per step | decoding |" in text
    assert "| gsm8k | 75.0 | 8 | 2.50 | threshold 0.8, gen 64, block 16, cache dual, early stop off |" in text
    assert "| `lr_scheduler_type` | `cosine` |" in text and "SchedulerType" not in text
    assert "Final training loss 1.2500 at step 10 (mean over training 1.8750)." in text
    assert f"- transformers {library_versions()['transformers']}" in text
    assert "revision='abc123', adapter=\"me/llada-trims\")" in text
    assert hub.PAPER_TITLE in text and "Lingjie Chen" in text and "with TRIMS" in text


def test_card_eval_line_runs_as_written():
    """The card's `trims eval` line parses with the command's own parser into the settings of its table."""
    card = trims_model_card(base_model="/models/my llama", dataset="me/s1K-trims", hyperparameters=HYPERPARAMETERS,
                            log_history=LOGS, decoding=DECODING, eval_data_file="data/gsm8k.jsonl",
                            model_kind="llada", mask_token_id=7, model_name="out/adapter")
    (line,) = [line for line in card.text.splitlines() if line.startswith("trims eval ")]
    model, args, decoding, response_format = eval_parser().parse(shlex.split(line)[2:])
    assert (model.model_name_or_path, model.adapter, args.task, args.limit) == ("/models/my llama", "out/adapter", "gsm8k", 8)
    assert (model.model_kind, model.mask_token_id, args.data_file) == ("llada", 7, "data/gsm8k.jsonl")
    assert decoding == DECODING and response_format == ResponseFormat()
    assert "kind='llada', mask_token_id=7" in card.text  # the Python lines load the base the same way


def test_eval_command_for_code_tasks_and_other_strategies():
    line = eval_command("base", "me/adapter", "mbpp", DecodingConfig(strategy="fixed_steps", steps=128, temperature=0.5,
                                                                     seed=3, stop_token_ids=[5, 6]))
    _, args, decoding, _ = eval_parser().parse(shlex.split(line)[2:])
    assert args.allow_code_execution and args.task == "mbpp" and args.limit is None
    assert decoding == DecodingConfig(strategy="fixed_steps", steps=128, temperature=0.5, seed=3, stop_token_ids=[5, 6])
    argmax = eval_command("base", "me/adapter", "gsm8k", DecodingConfig(seed=3))  # a seed draws nothing at temperature 0
    assert "--seed" not in argmax and eval_parser().parse(shlex.split(argmax)[2:])[2] == DecodingConfig()


def test_card_for_local_inputs_and_the_baseline():
    hyper = {"TRIMS": {**HYPERPARAMETERS["TRIMS"], "trajectory_ratio": 0.0}}
    card = trims_model_card(base_model="/no/such/student", dataset="outputs/toy/scored", hyperparameters=hyper)
    data = card.data.to_dict()
    assert "base_model" not in data and "datasets" not in data and "model-index" not in data  # local paths are not Hub links
    assert "plain MDLM objective" in card.text and "No decoding evaluation" in card.text
    assert "No training loss was logged." in card.text
    assert "trims eval --model-name-or-path /no/such/student --adapter trims-adapter --task gsm8k" in card.text


def never_called(*args, **kwargs):
    raise AssertionError("training started before the Hub check failed")


@pytest.mark.parametrize("case,message", [
    ("no_token", "no Hugging Face token"),
    ("read_token", "no write access"),
    ("offline", "HF_HUB_OFFLINE"),
])
def test_push_access_fails_before_training(tmp_path, monkeypatch, capsys, case, message):
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", never_called)
    monkeypatch.setattr(hub, "get_token", lambda: None if case == "no_token" else "hf_fake")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", case == "offline")
    whoami = {"name": "me", "orgs": [], "auth": {"accessToken": {"role": "read", "displayName": "ro"}}}
    monkeypatch.setattr(hub.HfApi, "whoami", lambda self, token=None: whoami)
    code = main(["train", "--config", str(TOY), "--output_dir", str(tmp_path / "out"), "--push_to_hub", "true",
                 "--hub_model_id", "me/toy-trims"])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("positions, gen, block", [(None, 256, 32), (4096, 256, 32), (512, 256, 32), (256, 128, 32),
                                                   (100, 32, 32), (40, 16, 16), (3, 1, 1)])
def test_without_an_evaluation_the_suggested_decoder_fits_the_student(positions, gen, block):
    """The default decoder leaves at least half a small student's positions to the prompt, so the card's line runs."""
    card = trims_model_card(base_model="outputs/toy/base", dataset="outputs/toy/scored",
                            hyperparameters=HYPERPARAMETERS, positions=positions)
    assert f"--gen-length {gen} --block-length {block} " in card.text
    for n in range(2, 2100):
        decoding = fitting_decoder(n)  # a valid decoder (DecodingConfig checks it) within half the positions
        assert decoding.gen_length <= max(1, n // 2) and decoding.gen_length % decoding.block_length == 0
        assert decoding.gen_length == 256 or decoding.gen_length * 2 > n // 2  # halved no further than it must be


def test_a_configured_decoder_is_suggested_as_given_even_without_an_evaluation():
    card = trims_model_card(base_model="outputs/toy/base", dataset="outputs/toy/scored", hyperparameters=HYPERPARAMETERS,
                            decoding=DecodingConfig(gen_length=64, block_length=16), positions=100)
    assert "--gen-length 64 --block-length 16 " in card.text
