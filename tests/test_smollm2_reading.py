"""The SmolLM2 windows' reading (``replicate.py --read``), on the committed windows' reports."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from trims_hf.studies.smollm2.reading import geometric_mean_interval, read_window, read_windows

ROOT = Path(__file__).resolve().parents[1]
WINDOWS = ROOT / "docs" / "results" / "smollm2"
PROTOCOL_2 = [WINDOWS / f"window-{number}" for number in (2, 3, 4, 5, 6)]
"""The windows that ran protocol 2 (seeds 0 to 4)."""


def study_rows(folder: Path) -> dict[tuple[str, float], dict]:
    """results.json's own per-model rows, computed on the device when the window ran."""
    rows = json.loads((folder / "results.json").read_text())["study"]
    return {(row["model"], row["threshold"]): row for row in rows}


@pytest.mark.parametrize("folder", PROTOCOL_2, ids=lambda folder: folder.name)
def test_a_window_read_back_from_its_records_gives_its_own_numbers(folder):
    """Accuracy and tokens per step recounted from the graded problems equal what the window reported."""
    window = read_window(folder)
    rows = study_rows(folder)
    assert len(window.results) == len(rows) == 20
    for seed, result in window.results:
        assert seed == window.seed
        row = rows[result.model, result.decoding["threshold"]]
        assert sum(s.correct for s in result.samples) / len(result.samples) == pytest.approx(row["accuracy"]["mean"])
        counted = sum(s.non_eos_tokens for s in result.samples) / sum(s.nfe for s in result.samples)
        assert counted == pytest.approx(row["tokens_per_step"]["mean"])


def test_the_reading_gives_each_window_its_own_ratio_and_accuracy_difference():
    text = read_windows(PROTOCOL_2)
    for folder in PROTOCOL_2:
        rows = study_rows(folder)
        for (model, tau), row in rows.items():
            if not model.startswith("TRIMS"):
                continue
            difference = 100 * (row["accuracy"]["mean"] - rows["MDLM", tau]["accuracy"]["mean"])
            cell = f"{row['tokens_per_step_vs_mdlm']:.3f}x, {difference:+.1f} ("
            line = next(line for line in text.splitlines() if line.startswith(f"| {tau} | {model} |"))
            assert cell in line, (folder.name, line, cell)


def copy_window(source: Path, target: Path, **protocol: object) -> Path:
    shutil.copytree(source, target)
    path = target / "results.json"
    document = json.loads(path.read_text())
    document["protocol"].update(protocol)
    path.write_text(json.dumps(document))
    return target


def test_windows_that_cannot_be_read_together_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="same seed"):
        read_windows([PROTOCOL_2[0], copy_window(PROTOCOL_2[0], tmp_path / "again")])
    other = copy_window(PROTOCOL_2[1], tmp_path / "other", base_steps=700, seed=5)
    with pytest.raises(ValueError, match=r"different protocols \(base_steps\)"):
        read_windows([PROTOCOL_2[0], other])
    # A field one window's library did not have yet is named, not refused (window 2 predates compile_blocks).
    later = ", ".join(f"seed {seed} False" for seed in range(1, len(PROTOCOL_2)))
    lacking = f"lack (the library added them later): decoding.compile_blocks ({later})."
    assert lacking in read_windows(PROTOCOL_2)


def test_a_window_with_missing_or_unmatched_records_is_refused(tmp_path):
    bare = copy_window(PROTOCOL_2[1], tmp_path / "bare")
    (bare / "records.jsonl.gz").unlink()
    with pytest.raises(ValueError, match="bare: no records.jsonl.gz"):
        read_window(bare)
    short = copy_window(PROTOCOL_2[1], tmp_path / "short")
    with gzip.open(short / "records.jsonl.gz", "rt") as handle:
        lines = handle.readlines()
    with gzip.open(short / "records.jsonl.gz", "wt") as handle:
        handle.writelines(lines[1:])
    with pytest.raises(ValueError, match="records.jsonl.gz: 499 records of base"):
        read_window(short)
    unfinished = copy_window(PROTOCOL_2[1], tmp_path / "unfinished")
    document = json.loads((unfinished / "results.json").read_text())
    document.update(main_comparison_complete=False, missing=["train MDLM"])
    (unfinished / "results.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"unfinished \(missing: train MDLM\)"):
        read_window(unfinished)
    keyless = copy_window(PROTOCOL_2[1], tmp_path / "keyless")
    document = json.loads((keyless / "results.json").read_text())
    del document["selection"]
    (keyless / "results.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match="keyless: not a window's report \\(no field 'selection'"):
        read_window(keyless)
    broken = copy_window(PROTOCOL_2[1], tmp_path / "broken")
    (broken / "records.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="broken: a report file cannot be read"):
        read_window(broken)


def test_the_command_prints_the_reading_or_one_error_line(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("smollm2_replicate_read", ROOT / "recipes" / "smollm2" / "replicate.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    assert recipe.main(["--read", *map(str, PROTOCOL_2)]) == 0
    windows = "seed 0 (window-2), seed 1 (window-3), seed 2 (window-4), seed 3 (window-5), seed 4 (window-6);"
    assert capsys.readouterr().out.startswith(f"Windows: {windows}")
    assert recipe.main(["--read", str(PROTOCOL_2[0]), str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --read: ") and "none: no results.json" in err


@pytest.mark.parametrize("ratios", [[0.963, 1.025, 1.020, 1.004, 1.034], [1.2, 0.8], [0.5, 2.0, 1.0, 1.7, 0.9, 1.1, 0.95]])
def test_the_mean_ratio_over_seeds_is_the_geometric_mean_with_a_t_interval_on_the_logarithms(ratios):
    stats = pytest.importorskip("scipy.stats")
    logs = np.log(ratios)
    low, high = stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
    assert geometric_mean_interval(ratios) == f"{np.exp(logs.mean()):.3f}x ({np.exp(low):.3f}x, {np.exp(high):.3f}x)"
    assert geometric_mean_interval(ratios[:1]) == f"{ratios[0]:.3f}x (-, -)"


@pytest.mark.parametrize("ratios", [[], [1.0, 0.0], [1.0, -1.0], [1.0, float("nan")], [float("inf"), 1.0]])
def test_the_mean_ratio_refuses_what_has_no_logarithm(ratios):
    with pytest.raises(ValueError, match="positive, finite numbers"):
        geometric_mean_interval(ratios)


def test_the_reading_gives_each_row_its_mean_ratio_over_the_windows():
    text = read_windows(PROTOCOL_2)
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| 0.9 | TRIMS hard-to-easy |")]
    assert len(rows) == 1
    ratios = [float(cell.split("x,")[0]) for cell in rows[0][2:2 + len(PROTOCOL_2)]]
    mean = float(rows[0][-1].split("x")[0])
    assert mean == pytest.approx(np.exp(np.log(ratios).mean()), abs=2e-3)
    assert "(-, -)" not in text


def test_a_model_a_window_lacks_gets_no_cell_there_and_no_mean(tmp_path):
    partial = copy_window(PROTOCOL_2[1], tmp_path / "partial")
    document = json.loads((partial / "results.json").read_text())
    document["results"] = [row for row in document["results"] if row["model"] != "TRIMS easy-to-hard"]
    (partial / "results.json").write_text(json.dumps(document))
    with gzip.open(PROTOCOL_2[1] / "records.jsonl.gz", "rt") as source:
        kept = [line for line in source if json.loads(line)["model"] != "TRIMS easy-to-hard"]
    with gzip.open(partial / "records.jsonl.gz", "wt") as target:
        target.writelines(kept)
    lines = read_windows([PROTOCOL_2[0], partial]).splitlines()
    lacking = [line.split(" | ") for line in lines if line.startswith("| 0.9 | TRIMS easy-to-hard |")]
    assert len(lacking) == 1 and lacking[0][3] == "-" and lacking[0][-1] == "- |"
    assert lacking[0][2].startswith("0.970x") and lacking[0][4] == "0 of 2"  # seed 0's ratio, below 1
    present = [line.split(" | ") for line in lines if line.startswith("| 0.9 | TRIMS random |")]
    assert present[0][-1] != "- |" and present[0][4] == "1 of 2"  # 0.999x and 1.037x
