"""``trims eval`` end to end on a tiny saved student, its sweep output, and its input errors."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED, tiny_student
from peft import get_peft_model

from trims_hf import lora_config
from trims_hf.cli import main
from trims_hf.tasks.sandbox import resolve_isolation

GSM8K_TEST = str(SHARED / "data" / "gsm8k" / "test.jsonl")
SMALL = ["--gen-length", "32", "--block-length", "16", "--limit", "3", "--no-progress"]


@pytest.fixture(scope="module")
def saved_student(tmp_path_factory, tokenizer) -> str:
    folder = tmp_path_factory.mktemp("student")
    tiny_student(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_eval_writes_result_json(saved_student, tmp_path, capsys):
    output = tmp_path / "results.json"
    code = main(["eval", "--model", saved_student, "--task", "gsm8k", "--data-file", GSM8K_TEST,
                 "--output", str(output), *SMALL])
    assert code == 0
    result = json.loads(output.read_text())
    assert result["task"] == "gsm8k" and result["model"] == saved_student and result["num_samples"] == 3
    assert 0 <= result["accuracy"] <= 1 and result["tokens_per_second"] > 0
    assert result["nfe"] == sum(s["nfe"] for s in result["samples"]) >= 3
    assert result["tokens_per_step"] == pytest.approx(result["generated_tokens"] / result["nfe"])
    assert [s["prompt_id"] for s in result["samples"]] == ["0", "1", "2"]
    assert result["prompt_format"]["template"] == "chat_template" and result["early_stop"] is True
    assert result["decoding"]["gen_length"] == 32 and result["decoding"]["threshold"] == 0.9
    assert "Tokens/step" in capsys.readouterr().out


def test_eval_sweep_with_adapter_prints_table_and_writes_plot(saved_student, tokenizer, tmp_path, capsys):
    adapter = tmp_path / "adapter"
    get_peft_model(tiny_student(tokenizer), lora_config(tiny_student(tokenizer), r=4)).save_pretrained(adapter)
    output = tmp_path / "sweep" / "results.json"
    code = main(["eval", "--model", saved_student, "--adapter", str(adapter), "--task", "gsm8k",
                 "--data-file", GSM8K_TEST, "--output", str(output), "--sweep", "0.5,0.95", "--no-early-stop", *SMALL])
    assert code == 0
    results = json.loads(output.read_text())["results"]
    assert [r["decoding"]["threshold"] for r in results] == [0.5, 0.95]
    assert all(r["early_stop"] is False and r["nfe"] >= 3 * 2 for r in results)  # two blocks each, no early stop
    assert results[0]["model"] == f"{saved_student} + {adapter}"
    assert output.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "| threshold 0.5 |" in out and "| threshold 0.95 |" in out and "early stop: off" in out


@pytest.mark.parametrize("arguments,message", [
    (["--task", "humaneval"], "--allow-code-execution"),
    (["--task", "gsm8k", "--data-file", "missing.jsonl"], "data file not found"),
    (["--task", "gsm8k", "--gen-length", "30"], "multiple of --block-length"),
])
def test_eval_input_errors(tmp_path, capsys, arguments, message):
    code = main(["eval", "--model", str(tmp_path / "never-loaded"), "--output", str(tmp_path / "r.json"), *arguments])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_eval_unknown_task(capsys):
    assert main(["eval", "--model", "m", "--task", "gsm9k", "--output", "r.json"]) == 2
    assert capsys.readouterr().err.startswith("error: --task gsm9k: unknown task 'gsm9k'")


def test_code_task_runs_model_output_in_the_sandbox(saved_student, tmp_path):
    """HumanEval end to end with the explicit opt-in: the random model's completions are executed and fail."""
    output = tmp_path / "humaneval.json"
    code = main(["eval", "--model", saved_student, "--task", "humaneval", "--allow-code-execution", "--output",
                 str(output), "--gen-length", "16", "--block-length", "16", "--limit", "2", "--no-progress"])
    assert code == 0
    result = json.loads(output.read_text())
    assert result["task"] == "humaneval" and result["num_samples"] == 2 and result["accuracy"] == 0.0
    assert all(sample["correct"] is False for sample in result["samples"])
    assert all(sample["error"] for sample in result["samples"])  # the sandbox reported why each failed
    assert {sample["isolation"] for sample in result["samples"]} == {resolve_isolation()}  # which sandbox ran it


def test_mbpp_three_shot_style_reaches_the_prompt(saved_student, tmp_path):
    output = tmp_path / "mbpp.json"
    code = main(["eval", "--model", saved_student, "--task", "mbpp", "--mbpp-style", "3shot", "--allow-code-execution",
                 "--data-file", str(SHARED / "data" / "mbpp" / "mbpp.jsonl"), "--output", str(output),
                 "--gen-length", "16", "--block-length", "16", "--limit", "1", "--no-progress"])
    assert code == 0
    result = json.loads(output.read_text())
    assert result["prompt_format"]["shots"] == 3 and result["num_samples"] == 1
