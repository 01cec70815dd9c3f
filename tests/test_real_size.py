"""bench/real_size.py: every part at tiny scale on the CPU (one run of the script), the batch search under simulated
out-of-memory errors, the accelerator table, and the real shapes (built on the meta device) against the public
configs. The real-size runs themselves need a GPU (README, "GPU (real size)")."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import real_size  # noqa: E402
import train_profile  # noqa: E402
from conftest import needs_deepspeed  # noqa: E402
from helpers_compile import NO_CODEGEN_PATH  # noqa: E402
from real_size_parts import common  # noqa: E402
from real_size_parts import decode as decoding  # noqa: E402
from real_size_parts import train as training  # noqa: E402
from real_size_parts.zero2 import ZERO2_STEPS  # noqa: E402

from trims_hf.studies.accelerators import Accelerator, TimeModel, accelerator  # noqa: E402


@pytest.fixture(scope="module")
def lines(tmp_path_factory) -> list[dict]:
    output = tmp_path_factory.mktemp("real_size") / "lines.jsonl"
    # The recipe part's compiled blocks lower without generated code (test_recipe_line_trains_the_recipe_as_... too).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join((str(NO_CODEGEN_PATH), str(ROOT)))}
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "real_size.py"), "--scale", "tiny", "--device", "cpu",
                             "--output", str(output)], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    printed = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"bench"')]
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert printed == written  # what is printed is what is appended, the ZeRO-2 worker's line included
    return written


def by_part(lines: list[dict], part: str) -> list[dict]:
    return [line for line in lines if line["part"] == part]


def student_lines(tmp_path, student: str) -> list[dict]:
    """The train and decode parts' lines of ``student`` at the tiny shape (batch 1, one step)."""
    output = tmp_path / f"{student}.jsonl"
    for part in ("train", "decode"):
        real_size.main(["--part", part, "--student", student, "--device", "cpu", "--max-batch", "1", "--steps", "1",
                        "--output", str(output)])
    return [json.loads(line) for line in output.read_text().splitlines()]


@pytest.mark.slow
@needs_deepspeed  # the tiny run's zero2 part
def test_one_line_per_measurement_naming_device_and_versions(lines):
    assert Counter(line["part"] for line in lines) == {"train": 4, "recipe": 1, "zero2": 1, "score": 1, "decode": 10}
    for line in lines:
        assert line["bench"] == "real_size" and line["scale"] == "tiny" and line["device_type"] == "cpu"
        assert line["device"].startswith("CPU: ") and line["dtype"] == "float32"
        assert {name: line["versions"][name] for name in ("torch", "transformers", "peft", "deepspeed")} == {
            name: version(name) for name in ("torch", "transformers", "peft", "deepspeed")}
        assert line.get("goals_met") is None  # goals are judged at real scale only


@pytest.mark.slow
@needs_deepspeed  # the tiny run's zero2 part
def test_training_lines_derive_their_numbers_from_the_measured_steps(lines):
    train = by_part(lines, "train")
    assert {(line["gradient_checkpointing"], line["per_device_batch"]) for line in train} == {
        (False, 1), (False, 4), (True, 1), (True, 4)}  # batch 1 and the largest fitting (the tiny limit, 4)
    config = common.model_config("llada", "tiny")
    for line in train:
        assert line["trims_over_mdlm"] == pytest.approx(line["trims_median_step_s"] / line["mdlm_median_step_s"], rel=2e-3)
        assert line["tokens_per_s"] == pytest.approx(line["per_device_batch"] * 256 / line["trims_median_step_s"], rel=2e-3)
        frozen = line["shape"]["parameters"] - config.vocab_size * config.hidden_size - (2 * 2 + 1) * config.hidden_size
        attention = 12 * config.num_hidden_layers * 256 * config.hidden_size
        assert line["flops_per_token"] == 4 * frozen + 6 * line["lora"]["parameters"] + attention
        assert line["mfu"] is None and line["peak_memory_gib"] > 0
        assert 0.5 * line["tokens_per_s"] <= line["real_tokens_per_s"] < line["tokens_per_s"]  # rows of 128 to 256 tokens
        assert line["precision"] == {"mixed_precision": "no", "autocast": False, "trained_weights": ["float32"],
                                     "max_grad_norm": 1.0, "fp32_logits_copy": None}


@pytest.mark.slow
@needs_deepspeed  # the tiny run's zero2 part
def test_zero2_line_comes_from_the_shipped_recipe(lines):
    (zero2,) = by_part(lines, "zero2")
    assert zero2["zero_stage"] == 2 and zero2["completed"] is True
    assert len(zero2["losses"]) == len(zero2["step_s"]) == ZERO2_STEPS
    after_first = zero2["step_s"][1:]
    assert zero2["tokens_per_s_after_first"] == pytest.approx(256 * len(after_first) / sum(after_first), rel=1e-2)
    assert "recipes/accelerate/zero2.yaml" in zero2["launch"]


@pytest.mark.slow
def test_recipe_line_trains_the_recipe_as_trims_train_does(tmp_path, monkeypatch, compile_without_codegen):
    """The recipe part on a card with room for 8 rows of the tiny student: the recipe's global batch of 32 split 8 x
    GA 4 by the batch search, its blocks compiled, and the numbers derived from the measured steps."""
    from trims_hf.training import batch_search

    probe = batch_search.probe_step

    def room_for_8(model, student, batch, length, args):
        if batch > 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        probe(model, student, batch, length, args)

    monkeypatch.setattr(batch_search, "probe_step", room_for_8)
    output = tmp_path / "recipe.jsonl"
    real_size.main(["--part", "recipe", "--device", "cpu", "--steps", "2", "--output", str(output)])
    (line,) = [json.loads(text) for text in output.read_text().splitlines()]
    assert line["recipe"] == "recipes/llada/trims_s1k.yaml" and line["compile_blocks"] is True
    assert (line["global_batch"], line["per_device_batch"], line["gradient_accumulation"], line["processes"]) == (32, 8, 4, 1)
    assert len(line["step_s"]) == len(line["losses"]) == 2
    assert line["median_step_s_after_first"] == line["step_s"][1]
    assert line["tokens_per_s"] == pytest.approx(32 * 256 / line["step_s"][1], rel=1e-3)
    assert line["s1k_tokens"] == 1000 * 30 * 256
    assert line["batch_search_s"] > 0
    minutes = (line["batch_search_s"] + line["step_s"][0] - line["step_s"][1] + line["s1k_tokens"] / line["tokens_per_s"]) / 60
    assert line["projected_s1k_minutes"] == pytest.approx(minutes, rel=1e-3, abs=1e-2)  # inputs rounded to 10 ms
    assert line["mfu"] is None and line["goals_met"] is None  # a CPU: no peak to judge against
    assert 0.2 < line["masked_fraction"] < 0.8 and line["mfu_of_flops_run"] is None
    config = common.model_config("llada", "tiny")
    assert line["flops_per_token"] - line["flops_per_token_run"] == pytest.approx(
        4 * config.vocab_size * config.hidden_size * (1 - line["masked_fraction"]), rel=1e-3)
    assert line["sequence_length"] == 256 and "save_strategy epoch" in line["projection"]


@pytest.mark.slow
@needs_deepspeed  # the tiny run's zero2 part
def test_scoring_line(lines):
    (score,) = by_part(lines, "score")
    lengths = score["lengths"]
    planned = lengths["prompt_tokens"] + lengths["completion_tokens"]
    assert score["rows"] == score["rows_scored"] == 40 and score["complete"] is True
    assert score["teacher_tokens"] == score["teacher_tokens_planned"] == planned
    assert score["batches_scored"] == score["batches_planned"] and score["logits_chunk_elements"] == 2**24
    assert lengths["longest_row"] <= (2048 + 16384) // 32
    assert score["tokens_per_s"] == pytest.approx(score["teacher_tokens"] / score["seconds"], rel=1e-2)
    assert score["seconds_per_million_tokens"] == pytest.approx(1e6 / score["tokens_per_s"], rel=1e-3)
    assert score["s1k_curation_estimate_s"] == pytest.approx(score["seconds"] * 1000 / 40, rel=1e-2)


@pytest.mark.slow
def test_scoring_stops_at_its_budget_and_extrapolates(tmp_path):
    """A budget passed by the first batch: one batch scored, the line extrapolates from its tokens/s."""
    output = tmp_path / "score.jsonl"
    real_size.main(["--part", "score", "--device", "cpu", "--score-budget-s", "1e-9", "--logits-chunk-elements",
                    "4096", "--output", str(output)])
    score = json.loads(output.read_text())
    assert score["batches_scored"] == 1 < score["batches_planned"] and score["complete"] is False
    assert 0 < score["rows_scored"] < 40 and score["teacher_tokens"] < score["teacher_tokens_planned"]
    assert score["positions_per_logits_chunk"] == 4096 // 512
    assert score["s1k_curation_estimate_s"] == pytest.approx(
        score["teacher_tokens_planned"] / score["tokens_per_s"] * 1000 / 40, rel=1e-2)


@pytest.mark.slow
@needs_deepspeed  # the tiny run's zero2 part
def test_decoding_lines_do_equal_work_per_mode(lines):
    decode = [line for line in by_part(lines, "decode") if line["measurement"] == "decode"]
    modes = ("none", "prefix", "dual")
    assert {(line["batch"], line["cache"], line["step"]) for line in decode} == {
        (b, m, s) for b in (1, 4) for m in modes for s in ("eager", "static") if s == "eager" or b == 1}
    config = common.model_config("llada", "tiny")
    for line in decode:
        none = next(other for other in decode if other["batch"] == line["batch"] and other["cache"] == "none"
                    and other["step"] == line["step"])
        assert line["nfe"] == none["nfe"] == line["batch"] * line["gen_length"]  # one token per step, every mode
        assert line["speedup_over_no_cache"] == pytest.approx(line["tokens_per_s"] / none["tokens_per_s"], rel=1e-2)
        assert line["forward_calls"] == line["model_forwards"] and 0 < line["forward_ms"] < line["wall_ms_per_model_forward"]
        assert line["host_ms_per_forward"] == pytest.approx(line["forward_ms"], rel=1e-2)  # on a CPU both are the clock
        assert line["wall_ms_per_model_forward"] == pytest.approx(
            line["wall_time_s"] * 1e3 / line["model_forwards"], rel=1e-2)
        assert 0 < line["identical_tokens_vs_no_cache"] <= 1 and none["identical_tokens_vs_no_cache"] == 1
        assert line["identical_tokens_vs_eager"] == 1  # a step mode changes how a forward runs, never a token
        assert len(line["prompt_tokens"]) == line["batch"] and line["prompt_tokens"][0] == 128
        assert len(set(line["prompt_tokens"])) == line["batch"]  # different lengths: the left-padded masked path
        assert line["weight_read_bytes"] == 4 * (line["shape"]["parameters"] - config.vocab_size * config.hidden_size)
        assert line["weight_read_bound_ms"] is None  # no bandwidth for a CPU
        assert line["replayed_calls"] == 0 and line["replay_forward_ms"] is None  # no CUDA graph on a CPU
    forms = [line for line in by_part(lines, "decode") if line["measurement"] == "attention_mask_form"]
    assert len(forms) == 1 and set(forms[0]["us_per_call"]) == {"none", "bool", "additive"}
    assert forms[0]["fastest_mask_form"] in ("bool", "additive") and forms[0]["batch"] == 4


@pytest.mark.slow
def test_training_variants_and_the_profile_summary(tmp_path):
    """Each variant trains a fresh student with its settings (the compiled one is a slow test of its own); the profile
    summary charges the step's time to categories that add up, with matmuls of the base and of the adapters seen."""
    output, profile = tmp_path / "train.jsonl", tmp_path / "profile.txt"
    real_size.main(["--part", "train", "--device", "cpu", "--train-variants", "eager,no_dropout", "--checkpointing", "off",
                    "--max-batch", "2", "--steps", "1", "--output", str(output), "--train-profile", str(profile)])
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(line["variant"], line["per_device_batch"]) for line in lines] == [
        ("eager", 1), ("eager", 2), ("no_dropout", 1), ("no_dropout", 2)]
    assert {line["gradient_checkpointing"] for line in lines} == {False}
    text = profile.read_text()
    assert text.startswith("== train (tiny, CPU: ") and "variant eager, batch 2 x 256" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines()
            if line.startswith("  ") and line.split()[0] in train_profile.CATEGORIES}
    shares = {name: float(row[-1].rstrip("%")) for name, row in rows.items()}
    assert set(shares) == set(train_profile.CATEGORIES) and sum(shares.values()) == pytest.approx(100, abs=0.5)
    # Times, not shares: a step stalled by a busy machine can round a small category's share down to 0.0%.
    milliseconds = {name: float(row[1]) for name, row in rows.items()}
    assert all(milliseconds[name] > 0 for name in ("frozen_matmul", "lora", "attention", "loss"))


def test_profile_categories_read_an_operator_and_its_ancestors():
    def event(name, shapes=(), parent=None):
        return SimpleNamespace(name=name, input_shapes=[list(shape) for shape in shapes], cpu_parent=parent)

    category, vocab, rank = train_profile.category, 1000, 32
    backward = event("autograd::engine::evaluate_function: GroupedMmBackward0")
    assert category(event("aten::_grouped_mm", [(64, 128), (8, 128, 256)], backward), vocab, rank) == "frozen_matmul"
    assert category(event("aten::mm", [(64, 32), (32, 128)]), vocab, rank) == "lora"
    assert category(event("aten::mm", [(64, 128), (128, 1000)]), vocab, rank) == "lm_head"
    assert category(event("aten::copy_", [], event("aten::_grouped_mm", [(64, 128)])), vocab, rank) == "frozen_matmul"
    assert category(event("aten::index", [(64, 128)]), vocab, rank) == "other"
    assert category(event("aten::mm", [(64, 128)], event("Optimizer.step#AdamW.step")), vocab, rank) == "optimizer"


@pytest.mark.parametrize("fits_up_to", [0, 1, 3, 5, 8, 20])
def test_largest_batch_search(fits_up_to):
    tried = []

    def fits(size: int) -> bool:
        tried.append(size)
        return size <= fits_up_to

    assert common.largest_batch(fits, limit=8) == min(fits_up_to, 8)
    assert len(tried) <= 7 and max(tried) <= 8


OOM_ERRORS = [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
              RuntimeError("CUDA error: out of memory"),
              RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")]


def failing_step(tried: list[int], fits_up_to: int, error: BaseException, real_step=training.step):
    def step(trainer, collator, rows):
        tried.append(len(rows))
        if len(rows) > fits_up_to:
            raise error
        return real_step(trainer, collator, rows)
    return step


@pytest.mark.slow
@pytest.mark.filterwarnings("error::FutureWarning")  # checkpointing by transformers' current names
def test_train_part_steps_down_after_out_of_memory(tmp_path, monkeypatch):
    """A step that runs out of memory above batch 3 (simulated, as CUDA's RuntimeError) makes the search settle on 3,
    and training goes on; memory is released once the failed step's exception is gone."""
    tried, exceptions_alive = [], []
    monkeypatch.setattr(training, "step", failing_step(tried, 3, OOM_ERRORS[1]))
    monkeypatch.setattr(training, "release", lambda device: exceptions_alive.append(sys.exc_info()[0]))
    output = tmp_path / "train.jsonl"
    real_size.main(["--part", "train", "--device", "cpu", "--max-batch", "8", "--steps", "1", "--output", str(output)])
    train = [json.loads(line) for line in output.read_text().splitlines()]
    assert tried == [1, 2, 4, 3] * 2  # doubling, then bisection; without and with gradient checkpointing
    assert {line["largest_fitting_batch"] for line in train} == {3}
    assert sorted(line["per_device_batch"] for line in train) == [1, 1, 3, 3]
    assert exceptions_alive[:2] == [None, None]  # one per failed size, each after its except block


@pytest.mark.slow
def test_train_part_notes_when_batch_1_does_not_fit(tmp_path, monkeypatch):
    tried = []
    monkeypatch.setattr(training, "step", failing_step(tried, 0, OOM_ERRORS[0]))
    output = tmp_path / "train.jsonl"
    real_size.main(["--part", "train", "--device", "cpu", "--max-batch", "8", "--steps", "1", "--output", str(output)])
    train = [json.loads(line) for line in output.read_text().splitlines()]
    assert tried == [1, 1] and [(line["largest_fitting_batch"], line["gradient_checkpointing"]) for line in train] == [
        (0, False), (0, True)]


def expected_parameters(role: str) -> int:
    """Parameters from the public config dict alone: embeddings, untied head, per layer attention (with Qwen2's
    q/k/v biases, Qwen3's q/k norms), gated MLP and two norms, and the final norm."""
    c = common.PUBLIC_CONFIGS[role]
    if role == "llada":
        d, layers, heads, kv, mlp, vocab = (c[k] for k in ("d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden_size",
                                                            "vocab_size"))
    else:
        d, layers, heads, kv, mlp, vocab = (c[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                            "num_key_value_heads", "intermediate_size", "vocab_size"))
    head_dim = c.get("head_dim", d // heads)
    attention = 2 * d * heads * head_dim + 2 * d * kv * head_dim
    extra = {"llada": 0, "dream": heads * head_dim + 2 * kv * head_dim, "teacher": 2 * head_dim}[role]
    return 2 * vocab * d + layers * (attention + extra + 3 * d * mlp + 2 * d) + d


@pytest.mark.parametrize("role,parameters", [("llada", 8_015_581_184), ("dream", 7_615_616_512),
                                             ("teacher", 8_190_735_360)])
def test_real_shapes_match_the_public_configs(role, parameters):
    """The exact counts of the public models (8.02B, 7.62B, 8.19B), and the same from the config dicts by hand."""
    model = common.build_model(role, "real", "meta", torch.bfloat16)
    config, public = model.config, common.PUBLIC_CONFIGS[role]
    assert model.num_parameters() == expected_parameters(role) == parameters
    assert config.rope_parameters["rope_theta"] == public["rope_theta"] and config.tie_word_embeddings is False
    assert config.rms_norm_eps == public["rms_norm_eps"]
    assert config.max_position_embeddings == public.get("max_position_embeddings", public.get("max_sequence_length"))
    assert getattr(config, "is_causal", True) is (role == "teacher")


def test_accelerator_table():
    h100 = accelerator("NVIDIA H100 80GB HBM3")
    assert (h100.bf16_tflops, h100.bandwidth_tb_s) == (989.0, 3.35)
    assert accelerator("NVIDIA H100 PCIe").bandwidth_tb_s == 2.0
    assert accelerator("NVIDIA A100-SXM4-80GB").bandwidth_tb_s == 2.039
    assert accelerator("NVIDIA A100-SXM4-40GB").bandwidth_tb_s == 1.555
    assert accelerator("NVIDIA H200").bandwidth_tb_s == 4.8
    assert accelerator("NVIDIA H200 NVL").bf16_tflops == 835.0
    assert accelerator("NVIDIA GH200 144G HBM3e").bandwidth_tb_s == 4.9
    assert accelerator("NVIDIA GH200 480GB").bandwidth_tb_s == 4.0
    assert accelerator("Some other GPU") is None
    assert training.accelerator is decoding.accelerator is accelerator  # the benchmark reads the library's one table


def test_time_model_turns_counts_into_seconds_on_the_reference():
    model = TimeModel(matmul_efficiency=0.5, slack=2.0, bandwidth_efficiency=0.25)
    assert model.peak == accelerator("H100")
    assert model.matmul_s(989e12) == pytest.approx(2.0)  # half of 989 TFLOP/s
    assert model.read_s(3.35e12) == pytest.approx(4.0)  # a quarter of 3.35 TB/s
    assert model.budget(10.0) == 20.0


def test_goals_both_ways_and_unjudged_without_a_bound():
    assert common.train_shortfall(1.02, 0.40) == pytest.approx(1.0)
    assert common.train_shortfall(1.0, 0.2) == pytest.approx(2.0)  # half the MFU goal: twice off
    assert common.train_shortfall(1.0302, 0.8) == pytest.approx(1.01)
    assert common.train_shortfall(1.0, None) is None
    assert common.decode_shortfall(1.5, 20.0, 10.0) == pytest.approx(1.0)
    assert common.decode_shortfall(0.75, 1.0, 10.0) == pytest.approx(2.0)
    assert common.decode_shortfall(2.0, 40.0, 10.0) == pytest.approx(2.0)
    assert common.decode_shortfall(2.0, 1.0, None) is None
    real = real_size.parse(["--scale", "real", "--device", "cpu"])[1]
    assert real.judge(None) == {"goal_shortfall": None, "goals_met": None}
    assert real.judge(1.0) == {"goal_shortfall": 1.0, "goals_met": True}
    assert real.judge(1.0001) == {"goal_shortfall": 1.0001, "goals_met": False}
    tiny = real_size.parse(["--device", "cpu"])[1]
    assert tiny.judge(3.0) == {"goal_shortfall": None, "goals_met": None}


@pytest.mark.parametrize("argv,flag", [(["--steps", "0"], "--steps"), (["--max-batch", "-1"], "--max-batch"),
                                       (["--output", "/no/such/folder/x.jsonl"], "--output"),
                                       (["--output", "/tmp"], "--output"), (["--train-profile", "/tmp"], "--train-profile"),
                                       (["--device", "tpu"], "--device"), (["--device", "cuda:1"], "--device"),
                                       (["--score-budget-s", "0"], "--score-budget-s"),
                                       (["--logits-chunk-elements", "0"], "--logits-chunk-elements")])
def test_bad_flags_are_one_line_errors(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        real_size.main(argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and error.startswith("bench/real_size.py: error: argument " + flag)


@pytest.mark.slow
def test_profile_writes_a_table_and_marks_the_lines(tmp_path):
    output, profile = tmp_path / "score.jsonl", tmp_path / "profile.txt"
    real_size.main(["--part", "score", "--device", "cpu", "--output", str(output), "--profile", str(profile)])
    table = profile.read_text()
    assert table.startswith("== score (tiny, CPU: ") and "aten::mm" in table
    assert json.loads(output.read_text())["profiled"] is True


@pytest.mark.slow
def test_dream_student_lines_on_a_known_accelerator(tmp_path, monkeypatch):
    """The Dream shape (shifted logits, GQA, q/k/v biases) goes through the same training and decoding paths; with an
    accelerator of known peaks (a fake one) and goals judged, the lines derive MFU, bound and goals from their own
    numbers."""
    fake = Accelerator("Fake", bf16_tflops=1e-6, bandwidth_tb_s=1e-3)
    monkeypatch.setattr(training, "accelerator", lambda name: fake)
    monkeypatch.setattr(decoding, "accelerator", lambda name: fake)
    monkeypatch.setattr(common.Run, "judge", lambda self, short: {"goal_shortfall": short,
                                                                      "goals_met": None if short is None else short <= 1})
    lines = student_lines(tmp_path, "dream")
    assert {line["model"] for line in lines} == {"Dream-v0-Instruct-7B"}
    assert Counter(line["part"] for line in lines) == {"train": 2, "decode": 10}
    assert all(line["shape"]["kv_heads"] == 2 and line["accelerator"] == "Fake" for line in lines if "shape" in line)
    for line in by_part(lines, "train"):
        assert line["mfu"] == pytest.approx(line["flops_per_token"] * line["tokens_per_s"] / 1e6, rel=1e-3)
        assert line["goal_shortfall"] == pytest.approx(max(line["trims_over_mdlm"] / 1.02, 0.40 / line["mfu"]), rel=1e-3)
    for line in by_part(lines, "decode"):
        if line["measurement"] != "decode":
            continue
        bound = line["weight_read_bytes"] / 1e9 * 1e3
        assert line["weight_read_bound_ms"] == pytest.approx(bound, abs=1e-3)
        assert line["forward_over_bound"] == pytest.approx(line["forward_ms"] / bound, rel=1e-2, abs=1e-3)
        batch_1 = next(other for other in lines if other["part"] == "decode" and other.get("batch") == 1
                       and other.get("cache") == line["cache"] and other.get("step") == line["step"])
        assert line["tokens_per_s_over_batch_1"] == pytest.approx(  # written to 0.001
            line["tokens_per_s"] / batch_1["tokens_per_s"], rel=1e-2, abs=5e-4)
        eager = next(other for other in lines if other["part"] == "decode" and other.get("batch") == line["batch"]
                     and other.get("cache") == "dual" and other.get("step") == "eager")
        expected = {1: max(1.5 / line["speedup_over_no_cache"], line["forward_ms"] / (2.0 * bound)),
                    4: eager["tokens_per_s"] / line["tokens_per_s"]}[line["batch"]] \
            if line["cache"] == "dual" and line["step"] == "static" else None
        assert line["goal_shortfall"] == (None if expected is None else pytest.approx(expected, rel=1e-2))


@pytest.mark.parametrize("error", OOM_ERRORS, ids=["OutOfMemoryError", "cuda-runtime", "cublas"])
def test_measurement_steps_down_after_a_late_out_of_memory(error):
    recovered = []

    def measure(size: int) -> str:
        if size > 2:
            raise error
        return f"measured {size}"

    assert common.stepping_down(measure, 4, lambda: recovered.append(sys.exc_info()[0])) == (2, "measured 2")
    assert recovered == [None, None]  # recovered twice, outside the except block
    with pytest.raises(type(error)):
        common.stepping_down(lambda size: measure(size + 5), 3, lambda: None)


def test_other_runtime_errors_are_not_out_of_memory():
    with pytest.raises(RuntimeError, match="shape mismatch"):
        common.stepping_down(lambda size: (_ for _ in ()).throw(RuntimeError("shape mismatch")), 4, lambda: None)


def test_llada_moe_real_shape_counts_all_experts_and_routes_eight():
    """LLaDA-MoE-7B-A1B from its public config by hand: 7.36B parameters (64 experts of 3 x 2048 x 1024 per layer, q/k
    norms, the router), of which a token's matmuls use the attention, the router, its 8 routed experts and the head."""
    c = common.PUBLIC_CONFIGS["llada_moe"]
    d, layers, vocab, experts, routed, width = (c[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size",
                                                                "num_experts", "num_experts_per_tok",
                                                                "expert_intermediate_size"))
    head_dim = d // c["num_attention_heads"]
    attention, router, expert = 4 * d * d, experts * d, 3 * d * width
    per_layer = attention + 2 * head_dim + router + experts * expert + 2 * d
    model = common.build_model("llada_moe", "real", "meta", torch.bfloat16)
    assert model.num_parameters() == 2 * vocab * d + layers * per_layer + d == 7_356_880_896
    assert common.linear_weights(model) == vocab * d + layers * (attention + router + routed * expert)
    assert getattr(model.config, "is_causal", True) is False


def test_llada2_real_shape_is_16b_with_1_4b_active():
    """LLaDA2.0-mini from its public config by hand: 16.26B parameters (one dense layer, 19 of 256 experts of
    3 x 2048 x 512 plus a shared one, fused q/k/v with 4 kv heads, q/k norms, the router); a token's matmuls use the
    attention, the dense MLP, the routers, 8 routed experts and the shared one per layer, and the head: with the
    embedding row it reads, the model card's 1.4B active."""
    c = common.PUBLIC_CONFIGS["llada2"]
    d, layers, vocab, experts, routed, width, head_dim = (c[k] for k in (
        "hidden_size", "num_hidden_layers", "vocab_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
        "head_dim"))
    attention = d * (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * head_dim + d * d
    dense, router, expert = 3 * d * c["intermediate_size"], experts * d, 3 * d * width
    sparse = layers - c["first_k_dense_replace"]
    model = common.build_model("llada2", "real", "meta", torch.bfloat16)
    total = (2 * vocab * d + layers * (attention + 2 * head_dim + 2 * d) + dense + sparse * (router + (experts + 1) * expert)
             + d)
    assert type(model).__name__ == "LLaDA2ForCausalLM" and model.num_parameters() == total == 16_255_638_528
    active = vocab * d + layers * attention + dense + sparse * (router + (routed + 1) * expert)
    assert common.linear_weights(model) == active
    assert round((active + vocab * d) / 1e9, 1) == 1.4
    assert model.config.rope_parameters["partial_rotary_factor"] == 0.5 and getattr(model.config, "is_causal", True) is False


@pytest.mark.slow
def test_llada2_trains_and_decodes_at_the_tiny_shape(tmp_path):
    """The block-diffusion student through the train and decode parts: its [noised | clean] FLOPs, and its decoder
    timed on its own calls (:class:`BlockForward`) with no cache and its exact prefix cache (same tokens), eager and
    static (the same tokens as eager)."""
    lines = student_lines(tmp_path, "llada2")
    assert {line["model"] for line in lines} == {"LLaDA2.0-mini"}
    assert all(line["forward_positions_per_token"] == 2 for line in by_part(lines, "train"))
    decodes = [line for line in by_part(lines, "decode") if line["measurement"] == "decode"]
    assert {(line["cache"], line["step"]) for line in decodes} == {
        (cache, step) for cache in ("none", "prefix") for step in ("eager", "static")}
    assert all(line["identical_tokens_vs_no_cache"] == 1.0 == line["identical_tokens_vs_eager"] for line in decodes)
    assert all(line["forward_calls"] == line["model_forwards"] > 0 for line in decodes)


def test_moe_bound_counts_the_experts_the_routing_reaches():
    """The tiny LLaDA-MoE (2 sparse layers of 4 experts, 2 routed per token) with its routers' choices overridden: layer 0
    sends every token to experts 1 and 3, layer 1 sends token 0 to 2 and 1 and the others to 0 and 2 in a first
    forward (3 experts), all to 0 and 2 in a second (2). The bound then reads 2 and 2.5 of each layer's 4 experts, an
    expert being gate, up and down of 64 x 32 in fp32; a dense student's bound is every weight but the embedding."""
    model = common.build_model("llada_moe", "tiny", "cpu", torch.float32).eval()
    ids = torch.randint(3, 500, (1, 12), generator=torch.Generator().manual_seed(0))
    routes = {0: [torch.tensor([[1, 3]] * 12)] * 2,
              1: [torch.tensor([[2, 1]] + [[0, 2]] * 11), torch.tensor([[0, 2]] * 12)]}
    calls = Counter()

    def route(layer: int):
        def override(module, args, output):
            logits, weights, _ = output
            calls[layer] += 1
            return logits, weights, routes[layer][calls[layer] - 1]
        return override

    handles = [model.model.layers[layer].mlp.gate.register_forward_hook(route(layer)) for layer in routes]
    with torch.no_grad(), decoding.routed_experts(model) as reached:
        model(input_ids=ids)
        model(input_ids=ids)
    for handle in handles:
        handle.remove()
    assert reached == {"model.layers.0.mlp.experts": 2, "model.layers.1.mlp.experts": 2.5}
    expert = 3 * 64 * 32 * 4
    assert {name: decoding.expert_bytes(module) for name, module in decoding.expert_modules(model).items()} == dict.fromkeys(
        reached, expert)
    every = decoding.weight_read_bytes(model)
    assert every == 4 * (model.num_parameters() - 512 * 64)
    assert decoding.weight_read_bytes(model, reached) == every - (4 - 2) * expert - (4 - 2.5) * expert
    dense = common.build_model("llada", "tiny", "cpu", torch.float32)
    with decoding.routed_experts(dense) as nothing:
        dense(input_ids=ids)
    assert decoding.expert_modules(dense) == nothing == {}
    assert decoding.weight_read_bytes(dense, nothing) == decoding.weight_read_bytes(dense) == 4 * (
        dense.num_parameters() - 512 * 64)


@pytest.mark.slow
def test_moe_decode_rows_with_compiled_blocks(tmp_path, monkeypatch, compile_without_codegen):
    """The tiny LLaDA-MoE through the decode part with the window's compiled graph step (timed on a CPU as the compiled
    static step, at batch 1 only): its rows say so in their columns and keep the eager tokens, and every row's bound is
    the bytes of the experts its forwards reach, at most all of them, from the line's own numbers."""
    fake = Accelerator("Fake", bf16_tflops=1e-6, bandwidth_tb_s=1e-3)
    monkeypatch.setattr(decoding, "accelerator", lambda name: fake)
    output = tmp_path / "moe.jsonl"
    torch._dynamo.reset()  # every graph this part needs is compiled by it
    real_size.main(["--part", "decode", "--student", "llada_moe", "--device", "cpu", "--cache-modes", "none,dual",
                    "--step-modes", "eager,graph,graph+compiled", "--output", str(output)])
    lines = [line for line in map(json.loads, output.read_text().splitlines()) if line["measurement"] == "decode"]
    assert {(line["batch"], line["cache"], line["step"], line["compile_blocks"]) for line in lines} == {
        (b, m, s, c) for b in (1, 4) for m in ("none", "dual") for s, c in (("eager", False), ("static", True))
        if b == 1 or not c}
    for line in lines:
        assert line["identical_tokens_vs_eager"] == 1 and "error" not in line
        assert (line["compiled_graphs"] > 0) if line["compile_blocks"] else (line["compiled_graphs"] is None)
        experts = line["experts_reached"]
        assert set(experts) == {"layers.0.mlp.experts", "layers.1.mlp.experts"}
        assert all(1 <= count <= 4 for count in experts.values())
        expert = 3 * 64 * 32 * 4
        unread = sum(4 - count for count in experts.values()) * expert
        rounding = 0.005 * expert * len(experts) + 1  # the counts are written to 0.01
        assert line["weight_read_bytes"] == pytest.approx(line["weight_read_bytes_all_experts"] - unread, abs=rounding)
        assert line["weight_read_bound_ms"] == pytest.approx(line["weight_read_bytes"] / 1e6, abs=1e-3)
        assert line["forward_over_bound"] == pytest.approx(line["forward_ms"] / line["weight_read_bound_ms"], rel=1e-2)
    dual = next(line for line in lines if line["batch"] == 1 and line["cache"] == "dual")
    assert dual["weight_read_bytes"] < dual["weight_read_bytes_all_experts"]  # a 32-token window skips some experts


@pytest.mark.slow
def test_a_failed_routing_decode_is_an_error_line_and_the_other_modes_go_on(tmp_path, monkeypatch):
    """An MoE student's untimed routing decode (which gives each cache mode its bound) failing on the device, here
    for the dual cache, costs that mode's lines only: one error line saying no step of it was timed, the others'
    lines as usual."""
    real, calls = decoding.routed_experts, []

    @contextlib.contextmanager
    def routing(model):
        calls.append(1)
        with real(model) as reached:
            if len(calls) % 2 == 0:  # the second cache mode of each batch: dual
                raise RuntimeError("CUDA error: out of memory")
            yield reached

    monkeypatch.setattr(decoding, "routed_experts", routing)
    output = tmp_path / "moe.jsonl"
    real_size.main(["--part", "decode", "--student", "llada_moe", "--device", "cpu", "--cache-modes", "none,dual",
                    "--step-modes", "eager", "--output", str(output)])
    lines = [line for line in map(json.loads, output.read_text().splitlines()) if line["measurement"] == "decode"]
    errors = [line for line in lines if "error" in line]
    assert {(line["batch"], line["cache"]) for line in errors} == {(1, "dual"), (4, "dual")}
    assert all("no step of this cache mode is timed" in line["skipped"] for line in errors)
    assert {(line["batch"], line["cache"]) for line in lines if "error" not in line} == {(1, "none"), (4, "none")}


@pytest.mark.slow
def test_the_decode_part_times_the_batches_asked_for(tmp_path):
    """``--decode-batches 1``: every decode row and the mask-form row at batch 1, each row's batch-1 reference its own."""
    output = tmp_path / "decode.jsonl"
    real_size.main(["--part", "decode", "--device", "cpu", "--cache-modes", "none,dual", "--step-modes", "eager",
                    "--decode-batches", "1", "--output", str(output)])
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    decode = [line for line in lines if line["measurement"] == "decode"]
    forms = [line for line in lines if line["measurement"] == "attention_mask_form"]
    assert sorted((line["batch"], line["cache"]) for line in decode) == [(1, "dual"), (1, "none")]
    assert forms and {line["batch"] for line in forms} == {1}
    assert not any("over_eager" in goal for goal in decode[0]["goals"])  # no larger batch: its goal is not judged
    assert all(line["tokens_per_s_over_batch_1"] == 1.0 for line in lines if line["measurement"] == "decode")


@pytest.mark.parametrize("batches, message", [("16", "rising batch sizes starting at 1"), ("1,4,4", "rising"),
                                              ("1,x", "whole numbers"), ("", "whole numbers"), ("1,-4", "whole numbers")])
def test_decode_batches_must_rise_from_1(batches, message, capsys):
    with pytest.raises(SystemExit):
        real_size.parse(["--device", "cpu", "--decode-batches", batches])
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"bench/real_size.py: error: argument --decode-batches: {batches!r}: ") and message in err


def test_a_decode_stopped_while_compiling_keeps_the_rows_already_timed(tmp_path, monkeypatch):
    """run_all.sh stops a part at its budget with SIGINT: the rows of the steps timed before the compiled blocks are
    in the output already."""
    timed = decoding.decode_modes

    def stopped_when_compiling(model, prompts, base, modes, steps):
        if steps[0].endswith(decoding.COMPILED):
            raise KeyboardInterrupt
        return timed(model, prompts, base, modes, steps)

    monkeypatch.setattr(decoding, "decode_modes", stopped_when_compiling)
    output = tmp_path / "decode.jsonl"
    with pytest.raises(KeyboardInterrupt):
        real_size.main(["--part", "decode", "--device", "cpu", "--cache-modes", "none,dual", "--step-modes",
                        "eager,static+compiled", "--decode-batches", "1", "--output", str(output)])
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted((line["cache"], line["step"]) for line in lines) == [("dual", "eager"), ("none", "eager")]


@pytest.mark.slow
def test_compiled_blocks_past_the_recompile_limit_are_an_error_row(tmp_path, monkeypatch, compile_without_codegen):
    """Dynamo runs the blocks past its recompile limit eagerly; a compiled row would then time eager blocks under the
    compiled step's name. The part makes it an error row instead, the other rows as usual."""
    import trims_hf.students.base as students_base

    monkeypatch.setattr(students_base, "GRAPHS_PER_BLOCK", 0)  # compile_blocks leaves dynamo's limit as it is
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    output = tmp_path / "decode.jsonl"
    torch._dynamo.reset()
    try:
        real_size.main(["--part", "decode", "--device", "cpu", "--cache-modes", "none,dual", "--step-modes",
                        "eager,static+compiled", "--decode-batches", "1", "--output", str(output)])
    finally:
        torch._dynamo.reset()  # the blocks' code object leaves its run-only state
    lines = {(line["cache"], line["step"], line["compile_blocks"]): line
             for line in map(json.loads, output.read_text().splitlines()) if line["measurement"] == "decode"}
    assert "error" not in lines["none", "eager", False] and "error" not in lines["dual", "eager", False]
    assert "FailOnRecompileLimitHit" in lines["dual", "static", True]["error"]


def test_graph_replays_are_told_apart_from_first_calls_and_captures(monkeypatch):
    """Under the graph step a shape's first call runs eagerly and its second captures: the rows' replay mean leaves
    both out, the overall mean keeps them. CapturedCalls' state machine stood in for on the CPU (no CUDA graph)."""
    from trims_hf.generation.cache import CapturedCalls, _Captured

    def stand_in(self, key, inputs, run):
        entry = self.captured.get(key)
        if entry is None:
            self.captured[key] = _Captured(dict(inputs))
        elif entry.graph is None:
            entry.graph = "captured"
        return run(inputs)

    def student_call(self, key, seconds):
        return self.graphs(key, {}, lambda inputs: time.sleep(seconds))

    monkeypatch.setattr(CapturedCalls, "__call__", stand_in)
    monkeypatch.setattr(decoding.StudentForward, "__call__", student_call)
    forward = decoding.StudentForward.__new__(decoding.StudentForward)
    forward.graphs = CapturedCalls.__new__(CapturedCalls)
    forward.graphs.captured = {}
    model = common.build_model("llada", "tiny", "cpu", torch.float32)
    calls = [("window", 0.03), ("window", 0.03), ("refresh", 0.03), ("window", 0.001), ("refresh", 0.03),
             ("window", 0.001), ("window", 0.001), ("refresh", 0.001)]
    with decoding.forward_times(torch.device("cpu"), model) as times:
        for key, seconds in calls:
            forward(key, seconds)
    assert times.replayed == [False, False, False, True, False, True, True, True]
    summary = times.summary()
    assert summary["forward_calls"] == 8 and summary["replayed_calls"] == 4
    assert summary["replay_forward_ms"] < 15 < summary["forward_ms"]  # 1 ms replays; the 30 ms first calls count
    assert CapturedCalls.__call__ is stand_in and decoding.StudentForward.__call__ is student_call  # put back


@pytest.mark.slow
def test_a_student_no_graph_captures_is_timed_without_the_graph_step(tmp_path, compile_without_codegen):
    """The tiny LLaDA-MoE in fp32, whose grouped GEMM no CUDA graph captures, asked for the graph steps: one line says
    they are left out and why, and the static step (the compiled blocks under it) is timed in their place."""
    output = tmp_path / "moe.jsonl"
    _, run = real_size.parse(["--part", "decode", "--student", "llada_moe", "--device", "cpu", "--cache-modes", "none",
                              "--step-modes", "eager", "--decode-batches", "1", "--output", str(output)])
    decoding.decode_part(replace(run, step_modes=("eager", "graph", "graph+compiled")))
    lines = [json.loads(line) for line in output.read_text().splitlines() if '"measurement": "decode"' in line]
    skipped = [line for line in lines if "skipped" in line]
    assert len(skipped) == 1 and "float32 experts run torch's grouped GEMM as a loop" in skipped[0]["skipped"]
    assert "times eager,static+compiled; " in skipped[0]["skipped"]
    assert sorted((line["step"], line["compile_blocks"]) for line in lines if "skipped" not in line) == [
        ("eager", False), ("static", True)]


@pytest.mark.slow
def test_a_batch_whose_prompts_do_not_fit_is_an_error_line(tmp_path, monkeypatch):
    """``--decode-batches 1,N`` with N beyond memory: the batch-1 rows, one error line for N, and the mask-form line
    at the largest batch that fitted; no traceback."""
    built = decoding.padded_prompts

    def prompts(batch, *args):
        if batch > 1:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
        return built(batch, *args)

    monkeypatch.setattr(decoding, "padded_prompts", prompts)
    output = tmp_path / "decode.jsonl"
    real_size.main(["--part", "decode", "--device", "cpu", "--cache-modes", "none", "--step-modes", "eager",
                    "--decode-batches", "1,100000000000", "--output", str(output)])
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    errors = [line for line in lines if "error" in line]
    assert [(line["batch"], line["skipped"]) for line in errors] == [(100000000000, "its prompts do not fit in memory")]
    assert [line["batch"] for line in lines if line["measurement"] == "decode" and "error" not in line] == [1]
    assert [line["batch"] for line in lines if line["measurement"] == "attention_mask_form"] == [1]


def test_a_head_tied_to_the_embedding_table_reads_all_of_it():
    """The weight-read bound leaves out the input table (only looked-up rows are read) unless the head is the same
    tensor: then the head's projection reads all of it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    for tied in (False, True):
        model = LlamaForCausalLM(LlamaConfig(**sizes, tie_word_embeddings=tied))
        every = 4 * sum(p.numel() for p in model.parameters())  # shared tensors once
        expected = every if tied else every - 4 * 300 * 32
        assert decoding.weight_read_bytes(model) == expected
