"""The one-command GPU window (bench/gpu): budgets from counts, the flags it passes, deadline and skipping, the part a
second call profiles. The window itself runs at tiny scale in the pre-flight (bench/gpu/preflight.sh), not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TESTS

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "bench" / "gpu")]

import budgets  # noqa: E402
import real_size  # noqa: E402
import worst_part as worst  # noqa: E402
from real_size_parts import decode as decoding  # noqa: E402
from worst_part import worst_part  # noqa: E402

RUN_ALL = ROOT / "bench" / "gpu" / "run_all.sh"


def test_budgets_follow_the_counts_of_each_part():
    seconds, explain = budgets.budgets("real")
    assert list(seconds) == ["tests", "decode", "train", "recipe", "score", "zero2"]  # most important first
    train, settings = explain["train"], budgets.Settings()
    compile_s = budgets.COMPILE_S if "compiled" in settings.train_variants else 0.0
    expected = budgets.WINDOW.slack * (budgets.STARTUP_S + budgets.BUILD_S * len(settings.train_variants)
                                       + train["matmul_s"] + train["host_s"] + compile_s)
    assert seconds["train"] == pytest.approx(expected, abs=1)
    assert train["matmul_s"] == pytest.approx(train["flops_per_token"] * train["rows_of_1024_tokens"] * 1024
                                              / (989e12 * budgets.WINDOW.matmul_efficiency), rel=0.01)
    bigger, _ = budgets.budgets("real", replace(budgets.Settings(), max_batch=32, score_budget_s=90.0))
    assert bigger["train"] > seconds["train"] and bigger["score"] == pytest.approx(seconds["score"] + 1.5 * 45, abs=1)
    fewer, _ = budgets.budgets("real", replace(budgets.Settings(), cache_modes=("none",)))
    assert fewer["decode"] < seconds["decode"]
    one_step, _ = budgets.budgets("real", replace(budgets.Settings(), step_modes=("eager",)))
    assert one_step["decode"] < seconds["decode"]
    one_variant, _ = budgets.budgets("real", replace(budgets.Settings(), train_variants=("eager",)))
    assert one_variant["train"] < seconds["train"]
    recipe = explain["recipe"]  # the batch search's probes from 32 rows down, then the steps of 32 rows
    assert recipe["rows_of_1024_tokens"] == 63 + 32 * settings.recipe_steps
    longer, _ = budgets.budgets("real", replace(budgets.Settings(), recipe_steps=2 * settings.recipe_steps))
    assert longer["recipe"] > seconds["recipe"]
    # Decoding without a cache at batch 16 is compute-bound, at batch 1 bound by reading the weights.
    decodes = explain["decode"]["decodes_per_mode"]
    decode = {key: value / decodes[int(key.split("@")[1])] for key, value in explain["decode"]["seconds"].items()}
    assert decode["none@16"] > 8 * decode["none@1"] and decode["dual@1"] < decode["none@1"]
    assert decodes == {1: 5, 16: 2}  # eager, static, graph and the compiled graph twice at batch 1; eager, graph
    uncompiled, _ = budgets.budgets("real", replace(budgets.Settings(), step_modes=("eager", "static", "graph")))
    assert seconds["decode"] - uncompiled["decode"] == pytest.approx(budgets.WINDOW.slack * (
        2 * budgets.DECODE_COMPILE_S + explain["decode"]["seconds"]["none@1"] / 5 * 2
        + explain["decode"]["seconds"]["dual@1"] / 5 * 2), abs=2)  # one compile a cache mode, whatever the depth
    assert budgets.budgets("tiny")[0] == dict.fromkeys(seconds, int(budgets.TINY_BUDGET_S))
    batch_1, batch_1_explain = budgets.budgets("real", replace(settings, decode_batches=(1,)))
    assert batch_1_explain["decode"]["decodes_per_mode"] == {1: 5}
    assert seconds["decode"] - batch_1["decode"] == pytest.approx(budgets.WINDOW.slack * (
        explain["decode"]["seconds"]["none@16"] + explain["decode"]["seconds"]["dual@16"]), abs=2)


@pytest.mark.parametrize("part", ["train", "recipe", "decode", "score"])
def test_flags_passed_to_real_size_are_the_budgeted_settings(part):
    settings = budgets.Settings()
    _, run = real_size.parse(["--scale", "real", "--device", "cpu", *settings.flags(part)])
    steps = {"train": settings.steps, "recipe": settings.recipe_steps}
    assert (run.steps, run.max_batch, run.score_budget_s, run.cache_modes) == (
        steps.get(part, real_size.SCALE_DEFAULTS["real"]["steps"]),
        settings.max_batch if part == "train" else real_size.SCALE_DEFAULTS["real"]["max_batch"],
        settings.score_budget_s if part == "score" else real_size.SCORE_BUDGET_S,
        settings.cache_modes if part == "decode" else real_size.CACHE_MODES)


@pytest.mark.slow  # a fresh interpreter importing torch
def test_the_decode_batches_asked_for_reach_real_size_only_when_asked():
    assert "--decode-batches" not in budgets.Settings().flags("decode")  # each scale's own batches
    flags = replace(budgets.Settings(), decode_batches=(1,)).flags("decode")
    assert real_size.parse(["--scale", "real", "--device", "cpu", *flags])[1].decode_batches == (1,)
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "budgets.py"), "--decode-batches", "1,1"],
                            capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == ("budgets.py: error: argument --decode-batches: '1,1': rising batch sizes "
                                              "starting at 1 (e.g. 1 or 1,16)")


@pytest.mark.parametrize("batches", ["1", "1,16", "01,16", "1,2,4", "16", "1,1", "0", "2,4", "1,8,4", "a", "1,,2",
                                     "1,16,", " 1", "1, 16", "\u00b2"])
def test_run_all_refuses_the_decode_batches_real_size_refuses_before_writing_anything(batches, tmp_path):
    """run_all.sh checks --decode-batches itself (its Python parser needs the carried wheels) with the same answers as
    ``parse_decode_batches``; what passes reaches the next check (here a missing --shared)."""
    try:
        decoding.parse_decode_batches(batches)
        accepted = True
    except ValueError:
        accepted = False
    result = run_all(str(tmp_path / "out"), "--decode-batches", batches, "--shared", "/no/such", tmp_path=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and not (tmp_path / "out").exists()
    assert result.stderr.startswith("error: --shared" if accepted else "error: --decode-batches must be"), result.stderr


def test_a_flag_without_its_value_is_a_usage_error(tmp_path):
    result = run_all(str(tmp_path / "out"), "--shared", str(TESTS), "--decode-batches", tmp_path=tmp_path)
    assert result.returncode == 2 and result.stderr == "error: --decode-batches needs a value\n"


@pytest.mark.parametrize("modes", ["dual", "none,sideways"])
def test_cache_modes_must_name_known_modes_and_the_reference(modes, capsys):
    with pytest.raises(SystemExit):
        real_size.parse(["--cache-modes", modes])
    assert "argument --cache-modes" in capsys.readouterr().err


def test_worst_part_is_the_largest_shortfall_above_one():
    lines = [{"part": "train", "goal_shortfall": 1.3}, {"part": "decode", "goal_shortfall": 2.5},
             {"part": "decode", "goal_shortfall": None}, {"part": "score", "goal_shortfall": 0.4}, {"part": "zero2"}]
    assert worst_part(lines) == ("decode", 2.5)
    assert worst_part([line for line in lines if line["part"] != "decode"]) == ("train", 1.3)
    assert worst_part([{"part": "score", "goal_shortfall": 1.0}]) is None  # met exactly
    assert worst_part([{"part": "score", "goal_shortfall": None}]) is None
    failed = {"part": "recipe", "error": "OutOfMemoryError: ..."}  # a part that failed missed its goal, by any factor
    assert worst_part([*lines, failed]) == ("recipe", float("inf"))


@pytest.mark.parametrize("content, expected", [
    (None, "error: {path}: no such file"), ('{"part": "decode"}\n\nnot json\n', "error: {path} line 3: not JSON"),
    ('[1, 2]\n', 'error: {path} line 1: not a real_size.py line (no "part")')])
def test_worst_part_refuses_what_it_cannot_read_in_one_line(content, expected, tmp_path, capsys):
    path = tmp_path / "real_size.jsonl"
    if content is not None:
        path.write_text(content)
    assert worst.main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(expected.format(path=path))
    assert worst.main([]) == 2 and capsys.readouterr().err.startswith("usage: worst_part.py")


def run_all(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SITE": str(tmp_path / "site"), "PYTHON": sys.executable, "WHEELS": str(tmp_path / "none")}
    return subprocess.run(["bash", str(RUN_ALL), *args], check=False, capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)


@pytest.mark.parametrize("args,message", [
    (["--parts", "train,fly"], "--parts: unknown part 'fly'"), (["--parts", ","], "--parts names no part"),
    (["--scale", "huge"], "--scale must be real or tiny"),
    (["--deadline", "8m"], "--deadline must be whole seconds"), (["--shared", "/no/such"], "--shared: /no/such/fixtures"),
    (["--profile-worst", "/no/such.jsonl"], "--profile-worst: /no/such.jsonl does not exist"),
    (["--colour"], "unknown argument --colour"), (["--decode-batches", "1;16"], "--decode-batches must be whole numbers")])
def test_usage_errors_are_one_line_and_write_nothing(args, message, tmp_path):
    result = run_all(str(tmp_path / "out"), *args, "--shared", str(TESTS), tmp_path=tmp_path) if "--shared" not in args \
        else run_all(str(tmp_path / "out"), *args, tmp_path=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {message}")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_parts_that_would_cross_the_deadline_are_skipped_with_a_line(tmp_path):
    out = tmp_path / "out"
    result = run_all(str(out), "--scale", "tiny", "--deadline", "30", "--parts", "train,score",
                     "--shared", str(TESTS), tmp_path=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    records = [json.loads(line) for line in (out / "parts.jsonl").read_text().splitlines()]
    assert records[0]["budgets_s"]["train"] == budgets.TINY_BUDGET_S  # the arithmetic first
    assert [(r["part"], r["status"]) for r in records[1:]] == [("train", "skipped"), ("score", "skipped")]
    assert all(r["left_s"] <= 30 for r in records[1:])
    assert json.loads((out / "env.json").read_text())["device"] == "cpu"
    assert "== train: skipped" in (out / "log.txt").read_text()


def test_profile_worst_does_nothing_when_every_goal_was_met(tmp_path):
    met = tmp_path / "met.jsonl"
    met.write_text(json.dumps({"part": "decode", "goal_shortfall": 0.9}) + "\n")
    result = run_all(str(tmp_path / "out"), "--profile-worst", str(met), "--shared", str(TESTS), tmp_path=tmp_path)
    assert result.returncode == 0 and "nothing to profile" in result.stdout


def test_budgets_refuse_an_explanation_file_that_is_a_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["budgets.py", "--explain-to", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        budgets.main()
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == ""
    assert err.splitlines()[-1] == f"budgets.py: error: argument --explain-to: {tmp_path} is a folder or its folder " \
                                   "does not exist"
