"""``trims eval`` end to end on a tiny saved student: result files, sweeps, resuming, and every input error
(one ``error:`` line, exit code 2, before any model loads, nothing written)."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import get_args

import pytest
from conftest import DATA, tiny_student
from peft import get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

import trims_hf.evaluation.evaluate as evaluation
import trims_hf.students as students
from trims_hf import lora_config
from trims_hf.cli import main
from trims_hf.evaluation.tasks import sandbox
from trims_hf.evaluation.tasks.sandbox import bubblewrap_problem, resolve_isolation
from trims_hf.model_config import StudentKind

GSM8K_TEST = str(DATA / "gsm8k" / "test.jsonl")
MBPP = str(DATA / "mbpp" / "mbpp.jsonl")
SMALL = ["--gen-length", "32", "--block-length", "16", "--limit", "3", "--no-progress"]
TIMINGS = {"decode_time_s", "wall_time_s", "tokens_per_second"}
RUN_CODE = ["--allow-code-execution", *([] if bubblewrap_problem() is None else ["--isolation", "process"])]
"""The opt-in a code task needs here: the default isolation where bubblewrap runs, the accepted weaker one elsewhere."""


@pytest.fixture(scope="module")
def plain_llama(tmp_path_factory, tokenizer) -> str:
    """A Llama causal LM folder as transformers saves it: no student mark, no mask id in its config."""
    folder = tmp_path_factory.mktemp("llama")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, tokenizer) -> str:
    folder = tmp_path_factory.mktemp("adapter")
    get_peft_model(tiny_student(tokenizer), lora_config(tiny_student(tokenizer), r=4)).save_pretrained(folder)
    return str(folder)


def read(path) -> list[dict]:
    payload = json.loads(path.read_text())
    assert set(payload) == {"units", "results", "aup"} and "fraction" in payload["units"]["accuracy"]
    return payload["results"]


def without_timings(result: dict) -> dict:
    samples = [{k: v for k, v in s.items() if k != "decode_time_s"} for s in result["samples"]]
    return {k: v for k, v in result.items() if k not in TIMINGS} | {"samples": samples}


def test_eval_writes_result_json(saved_student, tmp_path, capsys):
    output = tmp_path / "results.json"
    output.write_text("{}")  # an earlier run's results: a rerun replaces them
    code = main(["eval", "--model_name_or_path", saved_student, "--task", "gsm8k", "--data-file", GSM8K_TEST,
                 "--output", str(output), *SMALL])
    assert code == 0
    (result,) = read(output)  # one result: the same schema as a sweep
    assert result["task"] == "gsm8k" and result["model"] == saved_student and result["num_samples"] == 3
    assert result["accuracy"] == sum(s["correct"] for s in result["samples"]) / 3 and result["tokens_per_second"] > 0
    assert result["nfe"] == sum(s["nfe"] for s in result["samples"]) >= 3
    assert result["tokens_per_step"] == pytest.approx(result["generated_tokens"] / result["nfe"])
    assert [s["prompt_id"] for s in result["samples"]] == ["0", "1", "2"]
    gold = [json.loads(line)["answer"].rsplit("#### ", 1)[1] for line in open(GSM8K_TEST).readlines()[:3]]
    assert [s["reference"] for s in result["samples"]] == gold
    assert "Janet" in result["samples"][0]["prompt"] and result["samples"][0]["prompt"].startswith("<|user|>")
    assert result["prompt_format"]["template"] == "chat_template" and result["early_stop"] is True
    assert result["decoding"]["gen_length"] == 32 and result["decoding"]["threshold"] == 0.9
    assert set(result["versions"]) == {"trims_hf", "torch", "transformers", "peft", "datasets"}
    assert "gsm8k Acc (%, n=3)" in capsys.readouterr().out
    assert not output.with_suffix(".progress.jsonl").exists()  # the per-problem records live in the results now


def test_eval_sweep_with_adapter_prints_table_and_writes_plot(saved_student, adapter, tmp_path, capsys):
    output = tmp_path / "sweep" / "results.json"
    code = main(["eval", "--model", saved_student, "--adapter", adapter, "--task", "gsm8k",
                 "--data-file", GSM8K_TEST, "--output", str(output), "--sweep", "0.5,0.95", "--no-early-stop",
                 "--compare", "paper:dream", *SMALL])
    assert code == 0
    results = read(output)
    assert [r["decoding"]["threshold"] for r in results] == [0.5, 0.95]
    assert all(r["early_stop"] is False and r["nfe"] >= 3 * 2 for r in results)  # two blocks each, no early stop
    assert results[0]["model"] == f"{saved_student} + {adapter}"
    assert output.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "| threshold 0.5 |" in out and "| threshold 0.95 |" in out and "early stop: off" in out
    assert "| d3LLM (published, TRIMS paper, Table 2) | published | 81.4 | 4.94 |" in out and "gsm8k AUP (y_max 83.9)" in out
    aup = json.loads(output.read_text())["aup"]["rows"]
    assert aup[0]["model"] == f"{saved_student} + {adapter}" and aup[0]["points"] == 2 and aup[0]["y_max"] == 83.9


def test_no_progress_hides_transformers_weight_loading_bar_too(saved_student, tmp_path, capsys):
    from transformers.utils import logging as transformers_logging

    arguments = ["eval", "--model", saved_student, "--task", "gsm8k", "--data-file", GSM8K_TEST, *SMALL[:4], "--limit",
                 "1"]
    assert main([*arguments, "--output", str(tmp_path / "r.json"), "--no-progress"]) == 0
    assert "Loading weights" not in capsys.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()  # the caller's setting, restored
    assert main([*arguments, "--output", str(tmp_path / "shown.json")]) == 0
    assert "Loading weights" in capsys.readouterr().err


def test_interrupted_eval_resumes_to_the_uninterrupted_result(saved_student, tmp_path, capsys, monkeypatch):
    arguments = ["eval", "--model", saved_student, "--task", "gsm8k", "--data-file", GSM8K_TEST, *SMALL]
    assert main([*arguments, "--output", str(tmp_path / "whole.json")]) == 0
    output = tmp_path / "part" / "results.json"
    decode, calls = evaluation.generate_text, []

    def interrupted_at_the_second_problem(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return decode(*args, **kwargs)

    monkeypatch.setattr(evaluation, "generate_text", interrupted_at_the_second_problem)
    capsys.readouterr()
    assert main([*arguments, "--output", str(output)]) == 130
    records = output.with_suffix(".progress.jsonl")
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line == f"error: interrupted: 1 of 3 gsm8k problems (threshold 0.9) saved in {records}; rerun the same " \
                        "command to resume."
    assert not output.exists() and len(records.read_text().splitlines()) == 1
    monkeypatch.setattr(evaluation, "generate_text", decode)
    assert main([*arguments, "--output", str(output)]) == 0
    assert "resuming: 1 of 3 gsm8k problems done" in capsys.readouterr().err
    assert without_timings(read(output)[0]) == without_timings(read(tmp_path / "whole.json")[0])
    assert not records.exists()


def test_interrupt_before_the_first_problem_writes_nothing(saved_student, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluation, "generate_text", interrupted)
    output = tmp_path / "out" / "results.json"
    assert main(["eval", "--model", saved_student, "--task", "gsm8k", "--data-file", GSM8K_TEST, "--output", str(output),
                 *SMALL]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "error: interrupted before the first problem was graded; nothing was written."
    assert not (tmp_path / "out").exists()


def test_plain_causal_lm_runs_with_model_kind_and_the_tokenizers_mask(plain_llama, tokenizer, tmp_path):
    output = tmp_path / "llama.json"
    code = main(["eval", "--model", plain_llama, "--model-kind", "dream", "--task", "gsm8k", "--data-file", GSM8K_TEST,
                 "--output", str(output), *SMALL[:4], "--limit", "1", "--no-progress"])
    assert code == 0 and read(output)[0]["num_samples"] == 1


def test_model_kind_choices_are_the_student_registry():
    assert sorted(get_args(StudentKind)) == sorted(students.STUDENTS)


@pytest.fixture
def nothing_loads(monkeypatch):
    """Input errors must be found before any weight is read."""
    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the input error was found")

    monkeypatch.setattr(students, "load_student", never)
    monkeypatch.setattr(students.loading.AutoModelForCausalLM, "from_pretrained", never)


def unreachable_hub(monkeypatch):
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise ConnectionError("Failed to resolve 'huggingface.co'")

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", refuse)


def hub_offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def no_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# (flags after --model/--output, expected error line without "error: "; {model}, {llama}, {tmp}, {adapter} filled in)
ERRORS = {
    "missing model path": (["--model", "./no-such-model", "--task", "gsm8k", "--data-file", GSM8K_TEST],
                           "--model-name-or-path ./no-such-model: no such file or folder.", None),
    "model id, Hub unreachable": (["--model", "me/student", "--task", "gsm8k", "--data-file", GSM8K_TEST],
                                  "--model-name-or-path me/student: not a local path, and the Hugging Face Hub is "
                                  "unreachable (Failed to resolve 'huggingface.co'); pass a local folder to "
                                  "--model-name-or-path.",
                                  unreachable_hub),
    "model id, offline mode": (["--model", "me/student", "--task", "gsm8k", "--data-file", GSM8K_TEST],
                               "--model-name-or-path me/student: not a local path and not in the Hugging Face cache, "
                               "and HF_HUB_OFFLINE is set; pass a local folder to --model-name-or-path.",
                               hub_offline),
    "model is a file": (["--model", "{tmp}/empty.jsonl", "--task", "gsm8k", "--data-file", GSM8K_TEST],
                        "--model-name-or-path {tmp}/empty.jsonl: a file; pass a folder or a Hub id.", None),
    "task data, Hub unreachable": (["--task", "gsm8k"],
                                   "--task gsm8k reads openai/gsm8k: not a local path, and the Hugging Face Hub is "
                                   "unreachable (Failed to resolve 'huggingface.co'); pass a local copy of the benchmark "
                                   "with --data-file.", unreachable_hub),
    "plain Llama": (["--model", "{llama}", "--task", "gsm8k", "--data-file", GSM8K_TEST],
                    "--model-name-or-path {llama} is a plain causal LM ('llama'); say how it was trained as a "
                    "diffusion student: --model-kind llada (logits unshifted) or --model-kind dream "
                    "(logits shifted by one).", None),
    "no mask id anywhere": (["--model", "{llama}", "--model-kind", "llada", "--tokenizer", "{tmp}/no-mask-tokenizer",
                             "--task", "gsm8k", "--data-file", GSM8K_TEST],
                            "--model-name-or-path {llama}: no mask token id in its config or tokenizer; set "
                            "--mask-token-id.", None),
    "mask id outside the vocabulary": (["--mask-token-id", "4000", "--task", "gsm8k", "--data-file", GSM8K_TEST],
                                       "--mask-token-id 4000: mask token id 4000 is outside the vocabulary (400 tokens) "
                                       "of --model-name-or-path {model}.", None),
    "model folder is an adapter": (["--model", "{adapter}", "--task", "gsm8k", "--data-file", GSM8K_TEST],
                                   "--model-name-or-path {adapter} is a peft adapter; pass it to --adapter and its base "
                                   "model to --model-name-or-path.", None),
    "missing adapter": (["--adapter", "./no-such-adapter", "--task", "gsm8k", "--data-file", GSM8K_TEST],
                        "--adapter ./no-such-adapter: no such file or folder.", None),
    "adapter folder without adapter_config.json": (["--adapter", "{model}", "--task", "gsm8k", "--data-file", GSM8K_TEST],
                                                   "--adapter {model}: the folder has no adapter_config.json (a full model "
                                                   "goes to --model-name-or-path).", None),
    "missing tokenizer": (["--tokenizer", "./no-such-tokenizer", "--task", "gsm8k", "--data-file", GSM8K_TEST],
                          "--tokenizer-name-or-path ./no-such-tokenizer: no such file or folder.", None),
    "unknown task": (["--task", "gsm9k"],
                     "--task gsm9k: unknown task 'gsm9k'; known tasks: gsm8k, humaneval, math500, mbpp", None),
    "code task without the opt-in": (["--task", "humaneval"],
                                     "--task humaneval is graded by running model-written code; add "
                                     "--allow-code-execution to run it in the sandbox.", None),
    "missing data file": (["--task", "gsm8k", "--data-file", "missing.jsonl"], "--data-file missing.jsonl: no such file.",
                          None),
    "data file of another type": (["--task", "gsm8k", "--data-file", "{tmp}/rows.csv"],
                                  "--data-file {tmp}/rows.csv: unsupported file type '.csv' (use .jsonl, .json).", None),
    "code data file of another type": (["--task", "humaneval", "--allow-code-execution", "--data-file", "{tmp}/rows.csv"],
                                       "--data-file {tmp}/rows.csv: unsupported file type '.csv' (use .jsonl, "
                                       ".jsonl.gz).", None),
    "data file that is a folder": (["--task", "gsm8k", "--data-file", str(DATA)], f"--data-file {DATA}: a folder, not a "
                                   "file.", None),
    "data file with other columns": (["--task", "gsm8k", "--data-file", MBPP],
                                     f"{MBPP}: row 0 has no field 'question' (fields: ['challenge_test_list', 'code', "
                                     "'task_id', 'test_list', 'test_setup_code', 'text'])", None),
    "empty data file": (["--task", "gsm8k", "--data-file", "{tmp}/empty.jsonl"],
                        "{tmp}/empty.jsonl: no gsm8k examples to evaluate", None),
    "decoder lengths": (["--task", "gsm8k", "--gen-length", "30"],
                        "--gen-length 30 must be a positive multiple of --block-length 32. (see `trims eval --help`)",
                        None),
    "prompt format": (["--task", "gsm8k", "--prompt-format", "oops"],
                      "--prompt-format must be one of chat_template, plain, verbatim or contain '{{prompt}}', got 'oops'. "
                      "(see `trims eval --help`)", None),
    "sweep value": (["--task", "gsm8k", "--sweep", "0.5,x"], "--sweep 0.5,x: 'x' is not a number. (see `trims eval --help`)",
                    None),
    "threshold above 1": (["--task", "gsm8k", "--threshold", "1.5"],
                          "--threshold 1.5: must be in [0, 1]. (see `trims eval --help`)", None),
    "negative threshold": (["--task", "gsm8k", "--threshold", "-0.1"],
                           "--threshold -0.1: must be in [0, 1]. (see `trims eval --help`)", None),
    "threshold nan": (["--task", "gsm8k", "--threshold", "nan"],
                      "--threshold nan: must be in [0, 1]. (see `trims eval --help`)", None),
    "negative temperature": (["--task", "gsm8k", "--temperature", "-1"],
                             "--temperature -1.0: must be a finite number >= 0. (see `trims eval --help`)", None),
    "sweep out of range": (["--task", "gsm8k", "--sweep", "0.5,1.5"], "--sweep 0.5,1.5: threshold=1.5: must be in [0, 1].",
                           None),
    "sweep nan": (["--task", "gsm8k", "--strategy", "entropy", "--sweep", "0.5,nan"],
                  "--sweep 0.5,nan: entropy_threshold=nan: must be a finite number >= 0.", None),
    "fractional step sweep": (["--task", "gsm8k", "--strategy", "fixed_steps", "--sweep", "32,2.5"],
                              "--sweep 32,2.5: fixed_steps sweeps steps, whole numbers; got 2.5.", None),
    "sweep value twice": (["--task", "gsm8k", "--sweep", "0.5,0.5"],
                          "--sweep 0.5,0.5: 0.5 is given twice; each value is one setting to decode.", None),
    "seed at temperature 0": (["--task", "gsm8k", "--seed", "5"],
                              "--seed 5 does nothing at --temperature 0 (argmax proposals draw nothing): give "
                              "--temperature above 0, or drop it.", None),
    "threshold with a sweep": (["--task", "gsm8k", "--threshold=0.5", "--sweep", "0.9"],
                               "--threshold 0.5 does nothing with --sweep 0.9, which sets --threshold of each run; "
                               "drop it.", None),
    "steps with the threshold strategy": (["--task", "gsm8k", "--steps", "3"],
                                          "--steps 3 does nothing with --strategy 'threshold': only fixed_steps and "
                                          "threshold_quota read it; drop it or choose a strategy that does. "
                                          "(see `trims eval --help`)", None),
    "entropy threshold with the threshold strategy": (["--task", "gsm8k", "--strategy", "threshold",
                                                       "--entropy_threshold", "0.1"],
                                                      "--entropy-threshold 0.1 does nothing with --strategy "
                                                      "'threshold': only entropy reads it; drop it or choose a strategy "
                                                      "that does.", None),
    "mbpp style on gsm8k": (["--task", "gsm8k", "--mbpp-style", "3shot"],
                            "--mbpp-style 3shot does nothing with --task gsm8k: only mbpp has prompt styles; drop it.",
                            None),
    "code execution on gsm8k": (["--task", "gsm8k", "--allow-code-execution"],
                                "--allow-code-execution does nothing with --task gsm8k, which is graded without running "
                                "code; drop it.", None),
    "isolation on gsm8k": (["--task", "gsm8k", "--isolation", "process"],
                           "--isolation process does nothing with --task gsm8k, which is graded without running code; "
                           "drop it.", None),
    "stop id outside the vocabulary": (["--task", "gsm8k", "--data-file", GSM8K_TEST, "--stop-token-ids", "2", "99999"],
                                       "--stop-token-ids: 99999 is outside the model's vocabulary (400 tokens), so it "
                                       "is never generated and stops nothing.", None),
    "compare": (["--task", "gsm8k", "--compare", "trims:llada"],
                ("--compare: 'trims:llada' is not a published table; choose paper:llada or paper:dream (the TRIMS "
                 "paper's Tables 1-2, LLaDA-Instruct and Dream-Instruct). (see `trims eval --help`)"), None),
    "limit": (["--task", "gsm8k", "--limit", "0"], "--limit must be at least 1, got 0. (see `trims eval --help`)", None),
    "batch size": (["--task", "gsm8k", "--batch-size", "0"],
                   "--batch-size must be at least 1, got 0. (see `trims eval --help`)", None),
    "output is a folder": (["--task", "gsm8k", "--output", "{tmp}"],
                           "--output {tmp}: a folder; name the file to write, e.g. {tmp}/results.json. "
                           "(see `trims eval --help`)", None),
    "output is the sweep's plot": (["--task", "gsm8k", "--sweep", "0.5,0.9", "--output", "{tmp}/r.png"],
                                   "--output {tmp}/r.png: the results and the --sweep frontier plot would both be "
                                   "written to {tmp}/r.png; name a .json file, e.g. {tmp}/r.json. "
                                   "(see `trims eval --help`)", None),
    "sweep's plot is a folder": (["--task", "gsm8k", "--sweep", "0.5,0.9", "--output", "{tmp}/plot.json"],
                                 "--output {tmp}/plot.json (the --sweep frontier plot: {tmp}/plot.png): a folder; name "
                                 "the file to write. (see `trims eval --help`)", None),
    "output under a file": (["--task", "gsm8k", "--output", "{tmp}/empty.jsonl/r.json"],
                            "--output {tmp}/empty.jsonl/r.json: {tmp}/empty.jsonl is a file, not a folder. "
                            "(see `trims eval --help`)", None),
    "system prompt without a chat template": (["--task", "gsm8k", "--data-file", GSM8K_TEST, "--prompt-format", "plain",
                                               "--system-prompt", "Be brief."],
                                              "--system-prompt goes into the chat template, and --prompt-format "
                                              "'plain' renders none; drop --system-prompt, or use --prompt-format "
                                              "'chat_template'. (see `trims eval --help`)", None),
    "system prompt with a tokenizer without a chat template": (
        ["--tokenizer", "{tmp}/no-template-tokenizer", "--task", "gsm8k", "--data-file", GSM8K_TEST, "--system-prompt",
         "Be brief."],
        "--system-prompt goes into the chat template, and the tokenizer has none (--prompt-format 'chat_template' "
        "renders plain text with it); drop --system-prompt.", None),
    "cuda without a GPU": (["--task", "gsm8k", "--data-file", GSM8K_TEST, "--device", "cuda"],
                           "--device cuda: no CUDA device is available here; use --device cpu.", no_cuda),
    "end of response not a token": (["--task", "gsm8k", "--data-file", GSM8K_TEST, "--end-of-response", "<|nope|>"],
                                    "--end-of-response: End-of-response token '<|nope|>' is not a single token of the "
                                    "student tokenizer.", None),
    "device name": (["--task", "gsm8k", "--data-file", GSM8K_TEST, "--device", "gpu0"],
                    "--device gpu0: not a device name (e.g. cpu, cuda, cuda:1).", None),
    "graph step on the CPU": (["--task", "gsm8k", "--data-file", GSM8K_TEST, "--device", "cpu", "--step", "graph"],
                              "--step graph captures CUDA graphs, but the model runs on cpu; use --step static (what "
                              "--step auto runs there).", None),
    "output is the data file": (["--task", "gsm8k", "--data-file", "{tmp}/empty.jsonl", "--output", "{tmp}/empty.jsonl"],
                                "--output {tmp}/empty.jsonl is --data-file {tmp}/empty.jsonl, the benchmark it is made "
                                "from; write it to another file. (see `trims eval --help`)", None),
    "progress records are the data file": (["--task", "gsm8k", "--data-file", "{tmp}/r.progress.jsonl", "--output",
                                            "{tmp}/r.json"],
                                           "--output {tmp}/r.json (the progress records: {tmp}/r.progress.jsonl) is "
                                           "--data-file {tmp}/r.progress.jsonl, the benchmark it is made from; write it "
                                           "to another file. (see `trims eval --help`)", None),
    "more tokens than positions": (["--task", "gsm8k", "--data-file", GSM8K_TEST, "--gen-length", "2048"],
                                   "--gen-length 2048: the student has 2048 positions (max_position_embeddings), and the "
                                   "prompt needs some of them; generate fewer tokens.", None),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_input_errors_are_one_line_before_any_model_loads(case, saved_student, plain_llama, adapter, tokenizer, tmp_path,
                                                          capsys, monkeypatch, nothing_loads):
    flags, message, environment = ERRORS[case]
    if environment is not None:
        environment(monkeypatch)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "rows.csv").write_text("question,answer\n1 + 1?,#### 2\n")
    (tmp_path / "r.progress.jsonl").write_text(Path(GSM8K_TEST).read_text())
    (tmp_path / "plot.png").mkdir()
    no_mask = tokenizer.__class__.from_pretrained(plain_llama)
    no_mask.mask_token = None
    no_mask.save_pretrained(tmp_path / "no-mask-tokenizer")
    no_template = tokenizer.__class__.from_pretrained(saved_student)
    no_template.chat_template = None
    no_template.save_pretrained(tmp_path / "no-template-tokenizer")
    names = {"model": saved_student, "llama": plain_llama, "tmp": str(tmp_path), "adapter": adapter}
    output = tmp_path / "out" / "r.json"
    arguments = ["eval", "--model", saved_student, "--output", str(output), *[f.format(**names) for f in flags]]
    capsys.readouterr()
    started = time.perf_counter()
    code = main(arguments)
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: {message.format(**names)}\n"
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert (tmp_path / "empty.jsonl").read_text() == "" and (tmp_path / "r.progress.jsonl").read_text() == Path(
        GSM8K_TEST).read_text()  # nor any input overwritten
    assert elapsed < 20  # a Hub that does not answer costs one probe, not transformers' retries


def test_code_task_runs_model_output_in_the_sandbox(saved_student, tmp_path):
    """HumanEval end to end with the explicit opt-in: the random model's completions are executed and fail."""
    output = tmp_path / "humaneval.json"
    code = main(["eval", "--model", saved_student, "--task", "humaneval", *RUN_CODE, "--output",
                 str(output), "--gen-length", "16", "--block-length", "16", "--limit", "2", "--no-progress"])
    assert code == 0
    (result,) = read(output)
    assert result["task"] == "humaneval" and result["num_samples"] == 2 and result["accuracy"] == 0.0
    assert all(sample["correct"] is False for sample in result["samples"])
    assert all(sample["error"] for sample in result["samples"])  # the sandbox reported why each failed
    assert {sample["isolation"] for sample in result["samples"]} == {resolve_isolation()}  # which sandbox ran it
    assert "def has_close_elements" in result["samples"][0]["reference"]  # the canonical solution under its stub


def test_mbpp_three_shot_style_reaches_the_prompt(saved_student, tmp_path, capsys):
    """The three shots make a prompt of about 1,400 tokens, which the tiny student's 2,048 positions hold; a copy with
    512 positions is refused in one line before its model loads."""
    output = tmp_path / "mbpp.json"
    argv = ["eval", "--task", "mbpp", "--mbpp-style", "3shot", *RUN_CODE, "--data-file", MBPP, "--output", str(output),
            "--gen-length", "16", "--block-length", "16", "--limit", "1", "--no-progress"]
    shorter = tmp_path / "student"
    shutil.copytree(saved_student, shorter)
    config = json.loads((shorter / "config.json").read_text())
    (shorter / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 512}))
    assert main([*argv, "--model", str(shorter)]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"error: --task mbpp: problem \d+: --gen-length 16 after a prompt of \d{4} tokens reaches "
                        r"position \d{4}, past the model's max_position_embeddings=512; generate fewer tokens\.\n",
                        err), err
    assert not output.exists()
    code = main([*argv, "--model", saved_student])
    assert code == 0
    (result,) = read(output)
    assert result["prompt_format"]["shots"] == 3 and result["num_samples"] == 1
    assert result["samples"][0]["prompt"].count("[DONE]") == 3  # the three shots' answers, as the model saw them


@pytest.fixture
def no_bubblewrap(monkeypatch):
    """A machine where bwrap cannot run (the check the command makes first)."""
    monkeypatch.setattr(sandbox, "bubblewrap_problem", lambda: "bwrap is not installed")


def test_code_execution_without_bubblewrap_is_refused_before_any_input_is_read(no_bubblewrap, tmp_path, capsys):
    output = tmp_path / "out" / "mbpp.json"
    code = main(["eval", "--model", "./no-such-model", "--task", "mbpp", "--data-file", "/no/such.jsonl",
                 "--allow-code-execution", "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1  # one line, before the missing model and data are even looked at
    assert err == ("error: --allow-code-execution needs bubblewrap to isolate model-written code, and bwrap is not "
                   "installed: install it (sudo apt-get install bubblewrap), or add --isolation process to accept "
                   "weaker isolation (plain resource-limited processes, docs/sandbox.md).\n")
    assert not (tmp_path / "out").exists()


def test_accepted_process_isolation_runs_and_the_results_record_it(no_bubblewrap, saved_student, tmp_path):
    output = tmp_path / "mbpp.json"
    code = main(["eval", "--model", saved_student, "--task", "mbpp", "--data-file", MBPP, "--allow-code-execution",
                 "--isolation", "process", "--output", str(output), "--gen-length", "16", "--block-length", "16",
                 "--limit", "2", "--no-progress"])
    assert code == 0
    (result,) = read(output)
    assert result["num_samples"] == 2 and all(sample["error"] for sample in result["samples"])  # graded, not skipped
    assert [sample["isolation"] for sample in result["samples"]] == ["process", "process"]
