"""bench/real_size.py: every part at tiny scale on the CPU (one run of the script), the batch search under simulated
out-of-memory errors, the accelerator table, and the real shapes (built on the meta device) against the public
configs. The real-size runs themselves need a GPU (README, "GPU (real size)")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import real_size  # noqa: E402


@pytest.fixture(scope="module")
def lines(tmp_path_factory) -> list[dict]:
    output = tmp_path_factory.mktemp("real_size") / "lines.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "real_size.py"), "--scale", "tiny", "--device", "cpu",
                             "--output", str(output)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    printed = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"bench"')]
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert printed == written  # what is printed is what is appended, the ZeRO-2 worker's line included
    return written


def by_part(lines: list[dict], part: str) -> list[dict]:
    return [line for line in lines if line["part"] == part]


def test_one_line_per_measurement_naming_device_and_versions(lines):
    assert Counter(line["part"] for line in lines) == {"train": 4, "zero2": 1, "score": 1, "decode": 6}
    for line in lines:
        assert line["bench"] == "real_size" and line["scale"] == "tiny" and line["device_type"] == "cpu"
        assert line["device"].startswith("CPU: ") and line["dtype"] == "float32"
        assert {name: line["versions"][name] for name in ("torch", "transformers", "peft", "deepspeed")} == {
            name: version(name) for name in ("torch", "transformers", "peft", "deepspeed")}
        assert line.get("goals_met") is None  # goals are judged at real scale only


def test_training_lines_derive_their_numbers_from_the_measured_steps(lines):
    train = by_part(lines, "train")
    assert {(line["gradient_checkpointing"], line["per_device_batch"]) for line in train} == {
        (False, 1), (False, 4), (True, 1), (True, 4)}  # batch 1 and the largest fitting (the tiny limit, 4)
    config = real_size.model_config("llada", "tiny")
    for line in train:
        assert line["trims_over_mdlm"] == pytest.approx(line["trims_median_step_s"] / line["mdlm_median_step_s"], rel=2e-3)
        assert line["tokens_per_s"] == pytest.approx(line["per_device_batch"] * 256 / line["trims_median_step_s"], rel=2e-3)
        frozen = line["shape"]["parameters"] - config.vocab_size * config.hidden_size - (2 * 2 + 1) * config.hidden_size
        attention = 12 * config.num_hidden_layers * 256 * config.hidden_size
        assert line["flops_per_token"] == 4 * frozen + 6 * line["lora"]["parameters"] + attention
        assert line["mfu"] is None and line["peak_memory_gib"] > 0


def test_zero2_line_comes_from_the_shipped_recipe(lines):
    (zero2,) = by_part(lines, "zero2")
    assert zero2["zero_stage"] == 2 and zero2["completed"] is True
    assert len(zero2["losses"]) == len(zero2["step_s"]) == real_size.ZERO2_STEPS
    assert "recipes/accelerate/zero2.yaml" in zero2["launch"]


def test_scoring_line(lines):
    (score,) = by_part(lines, "score")
    lengths = score["lengths"]
    assert score["rows"] == 40 and score["teacher_tokens"] == lengths["prompt_tokens"] + lengths["completion_tokens"]
    assert lengths["longest_row"] <= (2048 + 16384) // 32
    assert score["tokens_per_s"] == pytest.approx(score["teacher_tokens"] / score["seconds"], rel=1e-2)
    assert score["seconds_per_million_tokens"] == pytest.approx(1e6 / score["tokens_per_s"], rel=1e-3)
    assert score["s1k_curation_estimate_s"] == pytest.approx(score["seconds"] * 1000 / 40, rel=1e-2)


def test_decoding_lines_do_equal_work_per_mode(lines):
    decode = by_part(lines, "decode")
    modes = ("none", "prefix", "dual")
    assert {(line["batch"], line["cache"]) for line in decode} == {(b, m) for b in (1, 4) for m in modes}
    config = real_size.model_config("llada", "tiny")
    for line in decode:
        none = next(other for other in decode if other["batch"] == line["batch"] and other["cache"] == "none")
        assert line["nfe"] == none["nfe"] == line["batch"] * line["gen_length"]  # one token per step, every mode
        assert line["speedup_over_no_cache"] == pytest.approx(line["tokens_per_s"] / none["tokens_per_s"], rel=1e-2)
        assert line["weight_read_bytes"] == 4 * (line["shape"]["parameters"] - config.vocab_size * config.hidden_size)
        assert line["weight_read_bound_ms"] is None  # no bandwidth for a CPU


@pytest.mark.parametrize("fits_up_to", [0, 1, 3, 5, 8, 20])
def test_largest_batch_search(fits_up_to):
    tried = []

    def fits(size: int) -> bool:
        tried.append(size)
        return size <= fits_up_to

    assert real_size.largest_batch(fits, limit=8) == min(fits_up_to, 8)
    assert len(tried) <= 7 and max(tried) <= 8


def test_train_part_steps_down_after_out_of_memory(tmp_path, monkeypatch):
    """A step that runs out of memory above batch 3 (simulated) makes the search settle on 3, and training goes on."""
    tried, real_step = [], real_size.step

    def step(trainer, collator, rows):
        tried.append(len(rows))
        if len(rows) > 3:
            raise torch.OutOfMemoryError("simulated")
        return real_step(trainer, collator, rows)

    monkeypatch.setattr(real_size, "step", step)
    output = tmp_path / "train.jsonl"
    real_size.main(["--part", "train", "--device", "cpu", "--max-batch", "8", "--steps", "1", "--output", str(output)])
    train = [json.loads(line) for line in output.read_text().splitlines()]
    assert tried == [1, 2, 4, 3] * 2  # doubling, then bisection; without and with gradient checkpointing
    assert {line["largest_fitting_batch"] for line in train} == {3}
    assert sorted(line["per_device_batch"] for line in train) == [1, 1, 3, 3]


def expected_parameters(role: str) -> int:
    """Parameters from the public config dict alone: embeddings, untied head, per layer attention (with Qwen2's
    q/k/v biases, Qwen3's q/k norms), gated MLP and two norms, and the final norm."""
    c = real_size.PUBLIC_CONFIGS[role]
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


@pytest.mark.parametrize("role,billions", [("llada", 8.0), ("dream", 7.6), ("teacher", 8.2)])
def test_real_shapes_match_the_public_configs(role, billions):
    model = real_size.build_model(role, "real", "meta", torch.bfloat16)
    config, public = model.config, real_size.PUBLIC_CONFIGS[role]
    assert model.num_parameters() == expected_parameters(role)
    assert round(model.num_parameters() / 1e9, 1) == billions
    assert config.rope_parameters["rope_theta"] == public["rope_theta"] and config.tie_word_embeddings is False
    assert config.rms_norm_eps == public["rms_norm_eps"]
    assert config.max_position_embeddings == public.get("max_position_embeddings", public.get("max_sequence_length"))
    assert getattr(config, "is_causal", True) is (role == "teacher")


def test_accelerator_table():
    h100 = real_size.accelerator("NVIDIA H100 80GB HBM3")
    assert (h100.bf16_tflops, h100.bandwidth_tb_s) == (989.0, 3.35)
    assert real_size.accelerator("NVIDIA H100 PCIe").bandwidth_tb_s == 2.0
    assert real_size.accelerator("NVIDIA A100-SXM4-80GB").bandwidth_tb_s == 2.039
    assert real_size.accelerator("NVIDIA A100-SXM4-40GB").bandwidth_tb_s == 1.555
    assert real_size.accelerator("NVIDIA H200").bandwidth_tb_s == 4.8
    assert real_size.accelerator("Some other GPU") is None


@pytest.mark.parametrize("argv,flag", [(["--steps", "0"], "--steps"), (["--max-batch", "-1"], "--max-batch"),
                                       (["--output", "/no/such/folder/x.jsonl"], "--output"),
                                       (["--device", "tpu"], "--device")])
def test_bad_flags_are_one_line_errors(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        real_size.main(argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and error.startswith("bench/real_size.py: error: argument " + flag)


def test_profile_writes_a_table_and_marks_the_lines(tmp_path):
    output, profile = tmp_path / "score.jsonl", tmp_path / "profile.txt"
    real_size.main(["--part", "score", "--device", "cpu", "--output", str(output), "--profile", str(profile)])
    table = profile.read_text()
    assert table.startswith("== score (tiny, CPU: ") and "aten::mm" in table
    assert json.loads(output.read_text())["profiled"] is True


def test_dream_student_trains_and_decodes(tmp_path):
    """The Dream shape (shifted logits, GQA, q/k/v biases) goes through the same training and decoding paths."""
    output = tmp_path / "dream.jsonl"
    for part in ("train", "decode"):
        real_size.main(["--part", part, "--student", "dream", "--device", "cpu", "--max-batch", "1", "--steps", "1",
                        "--output", str(output)])
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert {line["model"] for line in lines} == {"Dream-v0-Instruct-7B"}
    assert Counter(line["part"] for line in lines) == {"train": 2, "decode": 6}
    assert all(line["shape"]["kv_heads"] == 2 for line in lines)


def test_measurement_steps_down_after_a_late_out_of_memory():
    recovered = []

    def measure(size: int) -> str:
        if size > 2:
            raise torch.OutOfMemoryError("simulated")
        return f"measured {size}"

    assert real_size.stepping_down(measure, 4, lambda: recovered.append(1)) == (2, "measured 2")
    assert len(recovered) == 2
    with pytest.raises(torch.OutOfMemoryError):
        real_size.stepping_down(lambda size: measure(size + 5), 3, lambda: None)
