"""Model card content and metadata, and the Hub access check that runs before training (all offline)."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import ModelCard

import trims_hf.hub as hub
from trims_hf.cli import main
from trims_hf.model_card import evaluation_from_logs, trims_model_card

TOY = Path(__file__).resolve().parents[1] / "recipes" / "toy" / "trims_toy.yaml"
HYPERPARAMETERS = {"TRIMS": {"num_buckets": 8, "p_context": 0.05, "p_future": 0.95, "trajectory_ratio": 0.1},
                   "LoRA": {"r": 32, "alpha": 32}}


def test_card_content_and_metadata(tmp_path):
    evaluation = evaluation_from_logs([{"eval_gsm8k_accuracy": 0.5, "eval_loss": 1.0},
                                       {"eval_gsm8k_accuracy": 0.75, "eval_gsm8k_tokens_per_step": 2.5, "step": 9}])
    assert evaluation == {"gsm8k": {"accuracy": 0.75, "tokens_per_step": 2.5}}
    card = trims_model_card(base_model="GSAI-ML/LLaDA-8B-Instruct", base_model_revision="abc123",
                            dataset="me/s1K-trims", hyperparameters=HYPERPARAMETERS, evaluation=evaluation,
                            model_name="me/llada-trims")
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    data = loaded.data.to_dict()
    assert data["base_model"] == "GSAI-ML/LLaDA-8B-Instruct" and data["datasets"] == ["me/s1K-trims"]
    assert data["library_name"] == "peft" and {"trims", "mdlm"} <= set(data["tags"])
    assert data["trims"]["base_model_revision"] == "abc123" and data["trims"]["TRIMS"]["p_future"] == 0.95
    metrics = [m for result in data["model-index"][0]["results"] for m in result["metrics"]]
    assert {(m["type"], m["value"]) for m in metrics} == {("accuracy", 0.75), ("tokens_per_step", 2.5)}
    text = loaded.text
    assert "| gsm8k | 0.75 | 2.5 |" in text and "| `p_context` | `0.05` |" in text
    assert 'PeftModel.from_pretrained(base, "me/llada-trims")' in text and "trims eval --adapter me/llada-trims" in text
    assert hub.PAPER_TITLE in text and "Lingjie Chen" in text and "with TRIMS" in text


def test_card_for_local_inputs_and_the_baseline():
    hyper = {"TRIMS": {**HYPERPARAMETERS["TRIMS"], "trajectory_ratio": 0.0}}
    card = trims_model_card(base_model="/no/such/student", dataset="outputs/toy/scored", hyperparameters=hyper)
    data = card.data.to_dict()
    assert "base_model" not in data and "datasets" not in data and "model-index" not in data  # local paths are not Hub links
    assert "plain MDLM objective" in card.text and "No decoding evaluation" in card.text


def never_called(*args, **kwargs):
    raise AssertionError("training started before the Hub check failed")


@pytest.mark.parametrize("case,message", [
    ("no_token", "no Hugging Face token"),
    ("read_token", "no write access"),
    ("offline", "HF_HUB_OFFLINE"),
])
def test_push_access_fails_before_training(tmp_path, monkeypatch, capsys, case, message):
    monkeypatch.setattr("trims_hf.jobs.train.AutoTokenizer.from_pretrained", never_called)
    monkeypatch.setattr(hub, "get_token", lambda: None if case == "no_token" else "hf_fake")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", case == "offline")
    whoami = {"name": "me", "orgs": [], "auth": {"accessToken": {"role": "read", "displayName": "ro"}}}
    monkeypatch.setattr(hub.HfApi, "whoami", lambda self, token=None: whoami)
    code = main(["train", "--config", str(TOY), "--output_dir", str(tmp_path / "out"), "--push_to_hub", "true",
                 "--hub_model_id", "me/toy-trims"])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
