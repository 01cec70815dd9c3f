"""``trims demo``: the embedded task and tokenizer, and a ``--fast`` smoke run of the whole chain (twice: the second
run reuses what its changed setting does not touch)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trims_hf.cli import main
from trims_hf.determinism import DEFAULT_THREADS, PINNED_ENVIRONMENT
from trims_hf.studies.arith import ArithTask, make_splits
from trims_hf.studies.tiny import build_tokenizer

MODELS = 5  # base + MDLM + three TRIMS orderings
THRESHOLDS = (0.5, 0.9)
DEMO_THREADS = ["--threads", "1"]
"""The suite's demo runs compute on one thread: the default (two) contends with the other test worker for the cores,
and the claims tested here hold at any thread count the runs compared share."""


def test_splits_are_seeded_and_disjoint():
    train, test = make_splits(200, 20, seed=3)
    assert (train, test) == make_splits(200, 20, seed=3)
    assert not {r["question"] for r in test} & {r["question"] for r in train}
    assert len(test) == 20 and len(train) == 200


def test_gold_answers_grade_correct_in_both_answer_formats():
    _, test = make_splits(0, 60, seed=1)
    task = ArithTask(test)
    examples = task.load()
    assert {e.fields["answer"].splitlines()[-1].startswith("####") for e in examples} == {True, False}
    assert all(task.grade(e, e.fields["answer"])["correct"] for e in examples)
    assert not task.grade(examples[0], "The answer is 100000.")["correct"]


def test_tokenizer_splits_digits_and_round_trips():
    train, _ = make_splits(100, 0)
    tokenizer = build_tokenizer(r["question"] + "\n" + r["answer"] for r in train)
    text = train[0]["answer"]
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert all(len(t.lstrip("▁")) == 1 for t in tokens if any(c.isdigit() for c in t))
    assert tokenizer.decode(encoded["input_ids"]) == text
    assert encoded["offset_mapping"][-1][1] == len(text)
    assert tokenizer.unk_token_id not in encoded["input_ids"]


def test_the_library_and_the_recipes_never_import_the_demo():
    # The demo is a command over the library (its task is trims_hf.studies.arith, its small models trims_hf.studies.tiny):
    # only the command that runs it imports it.
    root = Path(__file__).resolve().parents[1]
    files = [*(root / "trims_hf").rglob("*.py"), *(root / "recipes").rglob("*.py"), *(root / "bench").rglob("*.py")]
    importers = []
    for path in files:
        if path.is_relative_to(root / "trims_hf" / "demo") or path == root / "trims_hf" / "commands" / "demo.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            level = getattr(node, "level", 0)
            if any(name.startswith("trims_hf.studies.demo") or (level and name.split(".")[0] == "demo") for name in names):
                importers.append(str(path.relative_to(root)))
    assert len(files) > 50 and importers == []


def markers(output: Path) -> dict[str, int]:
    """Every finished unit's marker (by its folder) and its modification time."""
    return {str(path.parent.relative_to(output)): path.stat().st_mtime_ns for path in output.rglob("cache-key.json")}


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory) -> tuple[Path, dict, dict, dict[str, int], dict[str, int], str]:
    """Two ``--fast`` runs into one folder, the second with other SFT steps: (output, both results, both runs'
    unit markers, the first run's table). One thread (:data:`DEMO_THREADS`)."""
    output = tmp_path_factory.mktemp("demo")
    argv = ["demo", "--fast", "--output", str(output), *DEMO_THREADS]
    assert main(argv) == 0
    first, first_markers = json.loads((output / "results.json").read_text()), markers(output)
    first_table = (output / "table.md").read_text()
    assert main([*argv, "--set", "variant_steps=7"]) == 0
    return output, first, json.loads((output / "results.json").read_text()), first_markers, markers(output), first_table


@pytest.mark.parametrize("flags, threads", [([], DEFAULT_THREADS), (["--threads", "1"], 1)])
def test_threads_are_pinned_unless_given(flags, threads, monkeypatch, tmp_path):
    from trims_hf.studies.demo import pipeline

    seen = []
    monkeypatch.setattr(pipeline.DemoStudy, "run", lambda self: seen.append(torch.get_num_threads()))
    torch.set_num_threads(3)  # as OMP_NUM_THREADS=3 would: the demo sets its own (conftest's guard restores it)
    assert main(["demo", "--fast", "--output", str(tmp_path), *flags]) == 0
    assert seen == [threads]


def test_each_stage_depends_on_the_settings_it_declares():
    """A stage's outputs are reused under a changed setting only when the stage does not depend on it: threads decide
    float results, so everything from the pretrained model on is rebuilt; SFT steps touch only the variants."""
    from dataclasses import replace

    from trims_hf.studies.demo.presets import FAST

    fewer_threads, more_steps = replace(FAST, threads=FAST.threads + 1), replace(FAST, variant_steps=7)
    assert fewer_threads.fingerprint("data") == FAST.fingerprint("data")
    assert all(fewer_threads.fingerprint(stage) != FAST.fingerprint(stage) for stage in ("pretrained", "base", None))
    assert all(more_steps.fingerprint(stage) == FAST.fingerprint(stage) for stage in ("data", "pretrained", "base"))
    assert more_steps.fingerprint() != FAST.fingerprint()


@pytest.mark.slow
def test_demo_results_do_not_depend_on_the_cpus_vector_instructions(demo_runs, tmp_path):
    """A process told to use ATen's portable kernels writes the results of one left to the CPU's best (the first of
    ``demo_runs``): the demo pins its code paths before torch loads."""
    _, best, *_, best_table = demo_runs
    env = {name: value for name, value in os.environ.items() if name not in PINNED_ENVIRONMENT}
    output = tmp_path / "default"
    result = subprocess.run([sys.executable, "-m", "trims_hf.cli", "demo", "--fast", "--output", str(output),
                             *DEMO_THREADS],
                            env=env | {"ATEN_CPU_CAPABILITY": "default"}, capture_output=True, text=True, timeout=1800,
                            check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    portable = json.loads((output / "results.json").read_text())
    assert [r["accuracy"] for r in portable["results"]] == [r["accuracy"] for r in best["results"]]
    assert without_timings(portable) == without_timings(best)
    assert (output / "table.md").read_text() == best_table


def without_timings(results: dict) -> dict:
    """results.json less what the clock (seconds, rates) or the installation decides."""
    if isinstance(results, dict):
        return {key: without_timings(value) for key, value in results.items()
                if not (key.endswith("_s") or "time" in key or key in ("versions", "tokens_per_second", "cached"))}
    return [without_timings(value) for value in results] if isinstance(results, list) else results


def test_main_after_torch_loaded_runs_the_command_in_a_pinned_child(monkeypatch):
    """From Python, with torch already loaded without the pins, the code paths can no longer change in-process: the
    command runs in a child process that has them, and its exit code is returned."""
    from trims_hf import determinism

    for name in PINNED_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    calls = []
    monkeypatch.setattr(determinism.subprocess, "run",
                        lambda argv, env, check: calls.append((argv, env)) or SimpleNamespace(returncode=7))
    assert determinism.run_pinned("trims_hf.cli", ["demo", "--fast"]) == 7
    (argv, env), = calls
    assert argv[1:] == ["-m", "trims_hf.cli", "demo", "--fast"]
    assert {name: env[name] for name in PINNED_ENVIRONMENT} == PINNED_ENVIRONMENT
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert determinism.run_pinned("trims_hf.cli", ["demo"]) is None and len(calls) == 1  # pinned before torch loaded


@pytest.mark.slow
def test_outputs_are_complete_and_consistent(demo_runs):
    output, first, *_ = demo_runs
    assert {"protocol", "variants", "unit_wall_s", "buckets", "results", "study", "teacher_nll_per_step",
            "nll_vs_decode_step_spearman"} <= set(first) and first["complete"]
    results = first["results"]
    assert len(results) == MODELS * len(THRESHOLDS)
    assert {r["decoding"]["threshold"] for r in results} == set(THRESHOLDS)
    for result in results:
        assert 0.0 <= result["accuracy"] <= 1.0
        # Ratio of totals; a smoke-run model may commit EOS late, so it can sit below 1 (forwards spent on
        # positions after the EOS are charged, their tokens are not counted).
        assert result["nfe"] >= 1 and result["tokens_per_step"] > 0.0
        assert result["tokens_per_step"] == pytest.approx(result["generated_tokens"] / result["nfe"])
        assert result["num_samples"] == first["protocol"]["num_test"]
    rows = [line for line in (output / "table.md").read_text().splitlines() if re.match(r"\| .* \| threshold ", line)]
    assert len(rows) == MODELS * len(THRESHOLDS)
    buckets = first["buckets"]["per_bucket"]
    assert len(buckets) == first["protocol"]["masking"]["num_buckets"]
    assert sum(b["nll_share"] for b in buckets) == pytest.approx(1.0)
    assert len(first["teacher_nll_per_step"]) == MODELS
    pngs = ["frontier.png", "teacher_nll_per_step.png", *(f"report/decode_order_{n}.png" for n in
            ("base", "mdlm-seed0", "trims_hard_to_easy-seed0", "trims_easy_to_hard-seed0", "trims_random-seed0"))]
    for name in pngs:
        assert (output / name).stat().st_size > 0, name
    assert (output / "results.json").read_bytes() == (output / "report" / "results.json").read_bytes()


@pytest.mark.slow
def test_rerun_reuses_what_the_changed_setting_does_not_touch(demo_runs):
    _, first, second, before, after, _ = demo_runs
    kept = {"data", "pretrained", "score", "base"}
    assert {unit: after[unit] for unit in kept} == {unit: before[unit] for unit in kept}
    assert all(after[unit] != before[unit] for unit in before if unit.startswith(("variants/", "eval/mdlm")))
    assert second["protocol"]["variant_steps"] == 7 and first["protocol"]["variant_steps"] == 6
    base = [(r["accuracy"], r["tokens_per_step"]) for r in first["results"] if r["model"] == "base (before SFT)"]
    assert base == [(r["accuracy"], r["tokens_per_step"]) for r in second["results"] if r["model"] == "base (before SFT)"]


def test_demo_presets_and_set_reach_the_settings(monkeypatch, tmp_path, capsys):
    """A preset changed field by field: --set takes several assignments and repeats; the later one wins; --fields
    prints the fields as set and runs nothing; abbreviations are refused."""
    from trims_hf.cli import main
    from trims_hf.studies.demo import pipeline
    from trims_hf.studies.demo.presets import FAST, DemoSettings

    seen = []
    monkeypatch.setattr(pipeline, "run_demo", lambda output, settings: seen.append(settings))
    assert main(["demo", "--set", "variant_steps=600", "thresholds=0.5,0.9", "--output", str(tmp_path)]) == 0
    assert main(["demo", "--study", "--set", "variant_steps=1", "--set", "variant_steps=600", "--output", str(tmp_path)]) == 0
    assert main(["demo", "--fast", "--data-file", str(tmp_path / "gsm8k.jsonl"), "--set", "seeds=3,4",
                 "--output", str(tmp_path)]) == 0
    assert (seen[0].variant_steps, seen[0].thresholds, seen[0].seeds) == (600, (0.5, 0.9), (0,))
    assert (seen[1].variant_steps, seen[1].seeds, seen[1].num_train) == (600, (0, 1, 2), DemoSettings().num_train)
    assert (seen[2].seeds, seen[2].num_train, seen[2].student_format.max_length) == ((3, 4), FAST.num_train, 512)
    assert main(["demo", "--fast", "--set", "variant_steps=9", "--fields"]) == 0 and len(seen) == 3
    assert "variant_steps=9\n" in capsys.readouterr().out
    assert main(["demo", "--fiel"]) == 2 and len(seen) == 3  # an abbreviation never silently sets a flag


GSM8K_ROW = {"question": "Tom has 2 apples and buys 3 more. How many?", "answer": "2 + 3 = 5\n#### 5"}


@pytest.mark.parametrize("flags,expected", [
    (["--fats"], r"unknown flag --fats \(did you mean --fast\?\)"),
    (["extra"], r"unexpected argument 'extra'"),
    (["--threads", "0"], r"threads=0: must be at least 1"),
    (["--threads", "two"], r"argument --threads: invalid int value: 'two'"),
    (["--set", "variant_steps=0"], r"variant_steps=0: must be at least 1"),
    (["--set", "num_test=0"], r"num_test=0: must be at least 1\.$"),
    (["--set", "data_seed=-1"], r"data_seed=-1: must be in \[0, 4294967295\]\.$"),
    (["--set", "seeds=0,-2"], r"seeds=-2: must be in \[0, 4294967295\]\.$"),
    (["--set", "base_lr=nan"], r"base_lr=nan: must be a finite number > 0\.$"),
    (["--set", "seeds=0,1,0"], r"seeds: 0 is given twice; each value once\.$"),
    (["--set", "thresholds=0.5,0.9,0.5"], r"thresholds: 0\.5 is given twice; each value once\.$"),
    (["--set", "thresholds=0.5,1.5"], r"thresholds: threshold=1\.5: must be in \[0, 1\]\.$"),
    (["--set", "teacher=qwen"], r"teacher=qwen: choose embedded or smollm2\."),
    (["--set", "hidden_size=63"], r"hidden_size=63, num_heads=2: each head takes hidden_size / num_heads dimensions, "
                                  r"which must be a whole even number \(rotary positions pair them\)\.$"),
    (["--set", "num_heads=64"], r"hidden_size=64, num_heads=64: each head takes"),  # one dimension a head: odd
    (["--set", "variant_step=3"], r"variant_step=3: no field variant_step \(did you mean variant_steps\?\); `trims demo "
                                  r"--fields` lists them\.$"),
    (["--set", "variant_steps"], r"variant_steps: expected FIELD=VALUE with FIELD one of .*variant_steps"),
    (["--set", "seeds=a"], r"seeds=a: 'a' is not a valid int\.$"),
    (["--set", "seeds="], r"seeds: give at least one SFT seed \(e\.g\. seeds=0 or seeds=0,1,2\)\.$"),
    (["--threads", "100000"], r"threads=100000: at most \d+ on this machine \(\d+ CPUs\)\.$"),
    (["--set", "threads=100000"], r"threads=100000: at most \d+ on this machine \(\d+ CPUs\)\.$"),
    (["--data-file", "{w}/missing.jsonl"], r"--data-file .*missing\.jsonl: no such file\.$"),
    (["--data-file", "{w}/prompts.jsonl"], r"--data-file .*prompts\.jsonl: row 0 has no field 'question'"),
    (["--data-file", "{w}/no-answer.jsonl"], r"--data-file .*no-answer\.jsonl: row 0 field 'answer' ends with no '#### N'"),
    (["--data-file", "{w}/few.jsonl"], r"--data-file .*few\.jsonl has 3 rows; the demo needs more than 8\.$"),
    (["--data-file", "{w}/rows.csv"], r"--data-file .*rows\.csv: unsupported file type '\.csv' \(use \.jsonl, \.json\)\.$"),
    (["--output", "{w}/a-file"], r"--output .*a-file: a file, not a folder\.$"),
    (["--data-file", "{w}/a-model"], r"--data-file .*a-model: a folder, not a file\.$"),
    (["--output", "{w}/a-model"], r"--output .*a-model is not empty \(config\.json\) and holds no study's run, whose "
                                  r"folders a study would replace: choose a new folder, or an earlier run's to continue it\.$"),
    (["--output", "{w}/a-project"], r"--output .*a-project is not empty \(data, table\.md\) and holds no study's run"),
])
def test_demo_mistakes_are_one_line_and_write_nothing(flags, expected, tmp_path, capsys):
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "1 + 1?", "completion": "2"}) + "\n")
    (tmp_path / "no-answer.jsonl").write_text(json.dumps({**GSM8K_ROW, "answer": "five"}) + "\n")
    (tmp_path / "few.jsonl").write_text((json.dumps(GSM8K_ROW) + "\n") * 3)
    (tmp_path / "rows.csv").write_text("question,answer\n1 + 1?,#### 2\n")
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-model").mkdir()
    (tmp_path / "a-model" / "config.json").write_text("{}")
    (tmp_path / "a-project" / "data").mkdir(parents=True)  # a user's folder with a folder of a stage's name
    (tmp_path / "a-project" / "data" / "thesis.csv").write_text("x\n1\n")
    (tmp_path / "a-project" / "table.md").write_text("mine")
    output = tmp_path / "out"
    assert main(["demo", "--fast", "--output", str(output), *(flag.format(w=tmp_path) for flag in flags)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and re.match(rf"error: {expected}", err), err
    assert not output.exists()
    assert (tmp_path / "a-project" / "data" / "thesis.csv").read_text() == "x\n1\n"
    assert sorted(path.name for path in (tmp_path / "a-project").rglob("*")) == ["data", "table.md", "thesis.csv"]


def test_a_study_runs_only_in_a_new_or_empty_folder_or_a_studys(tmp_path):
    """A study rebuilds its units' folders in place: a folder of a user's files is refused before anything is written
    (its data/ folder is not a study's first unit), whoever starts the study, the Python API and the regime's seeds
    too; a study's run, marked or made before the mark (a finished data/ unit, a protocol.json), continues."""
    from trims_hf.errors import InputError
    from trims_hf.studies.demo.pipeline import DemoStudy
    from trims_hf.studies.demo.presets import DemoSettings
    from trims_hf.studies.protocol import PROTOCOL_FILE
    from trims_hf.studies.regime.protocol import RegimeProtocol
    from trims_hf.studies.regime.seeds import run_seeds
    from trims_hf.studies.units import KEY_FILE, STUDY_MARK, check_study_folder, claim_study_folder

    user = tmp_path / "project"
    (user / "data").mkdir(parents=True)
    (user / "data" / "thesis.csv").write_text("x")
    with pytest.raises(InputError, match=r"^the study folder .*project is not empty \(data\) and holds no study's run"):
        DemoStudy(user, DemoSettings(), []).run()
    seeds = tmp_path / "regime"
    (seeds / "seed-3").mkdir(parents=True)
    (seeds / "seed-3" / "notes.txt").write_text("x")
    with pytest.raises(InputError, match=r"^--output .*regime \(seed 3: .*seed-3\) is not empty \(notes\.txt\)"):
        run_seeds(seeds, RegimeProtocol(), [2, 3])
    assert sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*")) == [
        "project", "project/data", "project/data/thesis.csv", "regime", "regime/seed-3", "regime/seed-3/notes.txt"]
    for made_by_a_study in (f"data/{KEY_FILE}", PROTOCOL_FILE, STUDY_MARK):
        folder = tmp_path / made_by_a_study.replace("/", "-")
        (folder / made_by_a_study).parent.mkdir(parents=True)
        (folder / made_by_a_study).write_text("{}")
        check_study_folder(folder, "--output")
    claim_study_folder(tmp_path / "new", "--output")
    assert (tmp_path / "new" / STUDY_MARK).is_file()
    check_study_folder(tmp_path / "new", "--output")


@pytest.mark.parametrize(("repeats", "system", "binds"), [
    ((1, 2), 0, "row \\d+'s prompt is \\d+ student tokens"),
    ((8, 12), 0, "row \\d+ is \\d+ teacher tokens, over the teacher's context of 4 x student_format.max_length = "),
    ((1, 2), 200, "the shortest prompt, row \\d+'s, is \\d+ teacher tokens"),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_least_max_length_named_is_where_scoring_and_the_base_stop_refusing(seed, repeats, system, binds):
    """``check_rows_fit`` names the least ``student_format.max_length`` for the rows, and it is the boundary of the
    later stages' own refusals: at it scoring's checks pass (every row within the teacher's context, some completion
    token within max_length teacher tokens) and the student tokenizes every prompt with room for a completion token;
    one less, one of them refuses. Rows of random lengths: short completions make the longest prompt bind (student
    side), long ones the longest row (teacher side), and a teacher whose chat template adds a system text of
    ``system`` words makes the shortest teacher prompt bind."""
    import copy
    import random
    from dataclasses import replace

    from datasets import Dataset

    from trims_hf.data.preparation import tokenize_example
    from trims_hf.data.schema import SchemaError
    from trims_hf.data.score_job import encode_for_scoring
    from trims_hf.errors import InputError
    from trims_hf.studies.demo.presets import DemoSettings
    from trims_hf.studies.stages import check_rows_fit

    stream, train = random.Random(seed), make_splits(40, 0, seed)[0]
    rows = [{"prompt": row["question"] * stream.randint(1, 3), "completion": row["answer"] * stream.randint(*repeats)}
            for row in train]
    student = build_tokenizer(row["prompt"] + "\n" + row["completion"] for row in rows)
    teacher = copy.deepcopy(student)
    teacher.chat_template = "{{ '" + "system " * system + "' }}" + student.chat_template

    def refusals(length: int) -> tuple[int, DemoSettings]:
        settings = replace(DemoSettings(), student_format=replace(DemoSettings().student_format, max_length=length))
        count = 0
        for refuse, *args in [*((tokenize_example, student, row["prompt"], row["completion"], settings.student_format)
                                for row in rows),
                              (encode_for_scoring, Dataset.from_list(rows), teacher, None, settings.scoring_options(),
                               settings.bucket_config())]:
            try:
                refuse(*args)
            except SchemaError:
                count += 1
        return count, settings

    with pytest.raises(InputError, match=r"^student_format\.max_length=2 is too short for the training rows: .*; set "
                                          r"it to at least \d+\.$") as refused:
        check_rows_fit(refusals(2)[1], rows, student, teacher)
    assert re.search(binds, str(refused.value)), refused.value
    least = int(re.search(r"at least (\d+)", str(refused.value)).group(1))
    count, settings = refusals(least)
    assert count == 0
    check_rows_fit(settings, rows, student, teacher)
    count, settings = refusals(least - 1)
    assert count > 0
    with pytest.raises(InputError, match=rf"max_length={least - 1} is too short .* at least {least}\.$"):
        check_rows_fit(settings, rows, student, teacher)


def test_a_max_length_too_short_for_the_rows_stops_before_the_teacher_trains(monkeypatch, tmp_path, capsys):
    """``--set student_format.max_length`` too short: one line naming the setting and the least that fits, before the
    pretrained model trains; the data unit is kept, so the corrected command reuses it."""
    from trims_hf.studies import tiny

    trained = []
    monkeypatch.setattr(tiny, "pretrain_tiny_llama", lambda *args, **kwargs: trained.append(args))
    argv = ["demo", "--fast", "--output", str(tmp_path), *DEMO_THREADS, "--set", "student_format.max_length=12"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and re.fullmatch(r"error: student_format\.max_length=12 is too short for the training rows: "
                                          r".*; set it to at least \d+\.", err[0]), err
    assert trained == [] and list(markers(tmp_path)) == ["data"] and not (tmp_path / "pretrained").exists()


def test_ctrl_c_is_one_line_and_a_rerun_starts_over_only_the_unit_it_cut(monkeypatch, tmp_path, capsys):
    """Ctrl-C while the teacher trains: exit 130 with one line that says what was kept; the data unit stays
    finished, and the cut unit is started afresh when the same command runs again."""
    from trims_hf.studies import tiny
    from trims_hf.studies.demo import pipeline

    def ctrl_c(folder: Path, *args, **kwargs) -> None:
        (folder / "half-written").write_text("")
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny, "pretrain_tiny_llama", ctrl_c)
    argv = ["demo", "--fast", "--output", str(tmp_path)]
    assert main(argv) == 130
    assert capsys.readouterr().err.splitlines()[-1:] == [
        f"error: interrupted in unit 'pretrained'; 1 finished unit kept in {tmp_path}: run the same command again to "
        "continue."]
    data = markers(tmp_path)
    assert list(data) == ["data"] and (tmp_path / "pretrained" / "half-written").is_file()

    seen = []

    def ctrl_c_before_scoring(study: pipeline.DemoStudy) -> None:
        seen.append((study.units.skipped, study.units.ran, sorted(p.name for p in (tmp_path / "pretrained").iterdir())))
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.DemoStudy, "stage_score", ctrl_c_before_scoring)
    monkeypatch.setattr(tiny, "pretrain_tiny_llama", lambda folder, *args, **kwargs: (folder / "model").write_text(""))
    assert main(argv) == 130
    assert seen == [(["data"], ["pretrained"], ["cache-key.json", "model", "unit.json"])]
    assert markers(tmp_path)["data"] == data["data"]
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: interrupted between units; 2 finished units kept in {tmp_path}: run the same command again to "
        "continue.")


@pytest.mark.slow
def test_importing_the_pipeline_leaves_matplotlib_alone():
    """Figures are built with the object API: no pyplot state, and the user's backend choice survives."""
    code = ("import sys, matplotlib, trims_hf.studies.demo.pipeline\n"
            "assert 'matplotlib.pyplot' not in sys.modules\n"
            "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()\n")
    env = {**os.environ, "MPLBACKEND": "svg"}
    completed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr


@pytest.mark.slow
def test_the_toy_recipes_two_documented_commands_run_in_order(tmp_path):
    """recipes/README.md's toy run, its commands as written, from a folder holding the recipes: the demo writes what
    the recipe reads (the scored data's folder among it)."""
    repo = Path(__file__).resolve().parents[1]
    section = (repo / "recipes" / "README.md").read_text().split("## Toy run on a CPU", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].split() for line in block.splitlines() if line.strip()]
    assert [command[:2] for command in commands] == [["trims", "demo"], ["trims", "train"]]
    (tmp_path / "recipes").symlink_to(repo / "recipes")
    env = {**os.environ, "PYTHONPATH": str(repo)}
    for command in commands:
        done = subprocess.run([sys.executable, "-m", "trims_hf.cli", *command[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{' '.join(command)}: {done.stderr[-2000:]}"
    assert (tmp_path / "outputs" / "toy" / "run" / "adapter_config.json").is_file()


def test_the_libraries_bars_are_silenced_during_the_stages_and_restored_after():
    import datasets
    from transformers.utils import logging as transformers_logging

    from trims_hf.reports import library_bars_silenced

    assert not datasets.are_progress_bars_disabled() and transformers_logging.is_progress_bar_enabled()
    with library_bars_silenced(False):
        assert not datasets.are_progress_bars_disabled() and transformers_logging.is_progress_bar_enabled()
    with library_bars_silenced():  # the stages' own bars are plain tqdm, untouched
        assert datasets.are_progress_bars_disabled() and not transformers_logging.is_progress_bar_enabled()
    assert not datasets.are_progress_bars_disabled() and transformers_logging.is_progress_bar_enabled()
