"""The s1K builder on small files in the official s1K / s1K-1.1 schemas (the real data is not reachable offline)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from datasets import Dataset, load_dataset
from helpers_teachers import save_teacher

from trims_hf.data.hub import read_card_metadata

SCRIPT = Path(__file__).resolve().parents[1] / "dataset_scripts" / "build_s1k_trims.py"
spec = importlib.util.spec_from_file_location("build_s1k_trims", SCRIPT)
build_s1k_trims = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = build_s1k_trims  # dataclasses look their module up while the script is executed
spec.loader.exec_module(build_s1k_trims)


def s1k_rows(gsm8k_rows, version: str) -> list[dict]:
    rows = []
    for r in gsm8k_rows[:3]:
        trace, answer = r["completion"].rsplit("####", 1)
        common = {"question": r["prompt"], "solution": answer.strip(), "cot_type": "math", "source_type": "gsm8k",
                  "metadata": "{}"}
        if version == "s1K":
            rows.append(common | {"cot": None, "thinking_trajectories": [trace.strip()],
                                  "attempt": f"The answer is {answer.strip()}."})
        else:
            rows.append(common | {f"{name}_{field}": f"{name} {text}" for name in ("gemini", "deepseek")
                                  for field, text in (("thinking_trajectory", trace.strip()), ("attempt", answer.strip()))})
    return rows


@pytest.fixture(scope="module")
def teacher_dir(tokenizer, tmp_path_factory) -> Path:
    return save_teacher(tokenizer, tmp_path_factory.mktemp("teacher"))


def test_builds_scored_s1k_from_a_local_parquet(gsm8k_rows, teacher_dir, tmp_path):
    source = tmp_path / "s1k.parquet"
    Dataset.from_list(s1k_rows(gsm8k_rows, "s1K")).to_parquet(str(source))
    out = tmp_path / "s1k-trims"
    assert build_s1k_trims.main(["--source", str(source), "--teacher", str(teacher_dir), "--output", str(out),
                                 "--num-buckets", "4"]) == 0
    scored = load_dataset(str(out), split="train")
    row = scored[0]
    assert row["prompt"] == gsm8k_rows[0]["prompt"]
    assert row["completion"].startswith("<think>\n") and "</think>\n\nThe answer is 72." in row["completion"]
    assert set(row["teacher_bucket"]) <= set(range(4)) and len(row["teacher_bucket"]) == len(row["teacher_nll"])
    assert row["teacher_token_end"][-1] == len(row["completion"])
    meta = read_card_metadata(out)
    assert meta["completion_template"] == build_s1k_trims.DEFAULT_TEMPLATE and meta["source_dataset"] == str(source)
    assert "license: mit" in (out / "README.md").read_text()


def test_s1k_11_uses_the_chosen_trace(gsm8k_rows, teacher_dir, tmp_path):
    source = tmp_path / "s1k11.jsonl"
    Dataset.from_list(s1k_rows(gsm8k_rows, "s1K-1.1")).to_json(str(source))
    out = tmp_path / "out"
    assert build_s1k_trims.main(["--source", str(source), "--trace", "gemini", "--teacher", str(teacher_dir),
                                 "--completion-template", "{trace}\nFinal: {answer}", "--output", str(out)]) == 0
    row = s1k_rows(gsm8k_rows, "s1K-1.1")[1]
    expected = f"{row['gemini_thinking_trajectory']}\nFinal: {row['gemini_attempt']}"
    assert load_dataset(str(out), split="train")[1]["completion"] == expected


@pytest.mark.parametrize(("version", "change", "flags", "expected"), [
    ("s1K", {"thinking_trajectories": [None]}, [],
     "row 1: column 'thinking_trajectories' (the {trace} of --completion-template) is empty; give rows with a trace "
     "and an answer."),
    ("s1K", {"thinking_trajectories": []}, [], "row 1: column 'thinking_trajectories' (the {trace} of"),
    ("s1K", {"attempt": "  "}, [], "row 1: column 'attempt' (the {answer} of --completion-template) is empty"),
    ("s1K-1.1", {"gemini_attempt": None}, ["--trace", "gemini"], "row 1: column 'gemini_attempt' (the {answer} of"),
    ("s1K", {}, ["--trace", "gemini"], "--trace gemini picks one of s1K-1.1's two traces, and the --source rows are "
                                       "s1K's, with one (thinking_trajectories, attempt); drop --trace."),
])
def test_rows_without_a_trace_or_answer_and_a_trace_s1k_lacks_are_refused(gsm8k_rows, teacher_dir, tmp_path, capsys,
                                                                          version, change, flags, expected):
    rows = s1k_rows(gsm8k_rows, version)
    rows[1] |= change
    source = tmp_path / "s1k.jsonl"
    Dataset.from_list(rows).to_json(str(source))
    out = tmp_path / "out"
    assert build_s1k_trims.main(["--source", str(source), "--teacher", str(teacher_dir), "--output", str(out),
                                 *flags]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith("error: " + expected), errors
    assert not out.exists()


def test_the_card_names_the_columns_read(gsm8k_rows, teacher_dir, tmp_path):
    """s1K has one trace: its card names no --trace choice, only the columns read (s1K-1.1's names the trace too)."""
    for version, flags, trace, columns in (("s1K", [], None, ("thinking_trajectories", "attempt")),
                                           ("s1K-1.1", ["--trace", "gemini"], "gemini",
                                            ("gemini_thinking_trajectory", "gemini_attempt"))):
        source, out = tmp_path / f"{version}.jsonl", tmp_path / f"out-{version}"
        Dataset.from_list(s1k_rows(gsm8k_rows, version)).to_json(str(source))
        assert build_s1k_trims.main(["--source", str(source), "--teacher", str(teacher_dir), "--output", str(out),
                                     *flags]) == 0
        meta = read_card_metadata(out)
        assert (meta["s1k_trace"], meta["s1k_trace_column"], meta["s1k_answer_column"]) == (trace, *columns)


def test_wrong_schema_is_refused_without_output(gsm8k_rows, teacher_dir, tmp_path, capsys):
    source = tmp_path / "bad.jsonl"
    Dataset.from_list([{"question": "q", "answer": "a"}]).to_json(str(source))
    out = tmp_path / "out"
    assert build_s1k_trims.main(["--source", str(source), "--teacher", str(teacher_dir), "--output", str(out)]) == 2
    assert "error: the --source rows have neither the columns thinking_trajectories, attempt (s1K)" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("flags, expected", [
    (["--source", "{tmp}/missing.parquet"], "--source {tmp}/missing.parquet: no such file or folder."),
    (["--completion-template", "{trace} {oops}"],
     "--completion-template '{{trace}} {{oops}}': 'oops' is not a field; use only {{trace}} and {{answer}}. (see "
     "`build_s1k_trims.py --help`)"),
    (["--completion-template", "{trace.foo}"],
     "--completion-template '{{trace.foo}}': 'trace.foo' is not a field; use only {{trace}} and {{answer}}. (see "
     "`build_s1k_trims.py --help`)"),
    (["--completion-template", "{answer!r}"],
     "--completion-template '{{answer!r}}': 'answer' is not a field; use only {{trace}} and {{answer}}. (see "
     "`build_s1k_trims.py --help`)"),
    (["--completion-template", "fixed"],
     "--completion-template 'fixed' holds neither {{trace}} nor {{answer}}: every row would get the same completion. "
     "(see `build_s1k_trims.py --help`)"),
    (["--completion-template", "{trace"],
     "--completion-template '{{trace' is not a format string (expected '}}' before end of string). (see "
     "`build_s1k_trims.py --help`)"),
    (["--limit", "-1"], "--limit -1: must be at least 1. (see `build_s1k_trims.py --help`)"),
    ([], "--source simplescaling/s1K (the default): not a local path and not in the Hugging Face cache, and "
         "HF_HUB_OFFLINE is set; pass a local .jsonl/.json/.parquet file or dataset folder to --source."),
    (["--source", "simplescaling/s1K"], "--source simplescaling/s1K: not a local path and not in the Hugging Face "
         "cache, and HF_HUB_OFFLINE is set; pass a local .jsonl/.json/.parquet file or dataset folder to --source."),
])
def test_mistakes_are_one_line_in_flag_terms(flags, expected, teacher_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    out = tmp_path / "out"
    flags = [flag.replace("{tmp}", str(tmp_path)) for flag in flags]
    try:
        code = build_s1k_trims.main(["--teacher", str(teacher_dir), "--output", str(out), *flags])
    except SystemExit as exit:  # a flag the parser rejects ends the script like any argparse error
        code = exit.code
    assert code == 2
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")] == [
        "error: " + expected.format(tmp=tmp_path)]
    assert list(tmp_path.iterdir()) == []
