"""The `trims` command: help for every sub-command imports only that command's dataclasses (fast `--help`);
no or an unknown command is one error line."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import needs_deepspeed

from trims_hf.cli import COMMANDS, main

HEAVY = ("trims_hf.training.trainer", "trims_hf.generation.decoding", "trims_hf.evaluation.harness.model",
         "trims_hf.data.score_job", "trims_hf.training.train_job", "trims_hf.studies.demo.pipeline", "peft", "datasets")


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--help"], *[[name, "--help"] for name in COMMANDS]], ids=lambda a: " ".join(a))
def test_help_imports_no_library_module(argv):
    code = (f"import sys, json; from trims_hf.cli import main; code = main({argv!r}); "
            f"print(json.dumps([code, sorted(m for m in {HEAVY!r} if m in sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    exit_code, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert exit_code == 0, done.stderr
    assert loaded == [], f"`trims {' '.join(argv)}` imported {loaded}"


@pytest.mark.parametrize("argv,problem", [([], "no command given"), (["trian"], "unknown command 'trian'"),
                                          (["--verbose"], "unknown command '--verbose'")])
def test_no_or_unknown_command_is_one_error_line(argv, problem, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"error: {problem}; choose one of {', '.join(COMMANDS)} "
                                       "(`trims --help` describes them).\n")


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"trims_hf {version('trims_hf')}\n"


FLAG_COMMANDS = [name for name in COMMANDS if name != "lm-eval"]
"""The commands whose flags are parsed from settings dataclasses (`trims train`'s own two; the recipe keys it passes
on have their page, `--help-keys`); `trims lm-eval` is the harness's own command line."""


def help_text(argv: list[str], capsys) -> tuple[str, dict[str, str]]:
    """A command's `--help` as (usage, {invocation: help text}), read from the page as printed."""
    assert main([*argv, "--help"]) == 0
    page = capsys.readouterr().out
    usage, _, rest = page.partition("\n\n")
    entries: dict[str, str] = {}
    invocation = None
    for line in rest.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            invocation, _, text = line.strip().partition("  ")
            entries[invocation] = text.strip()
        elif invocation and line.strip():
            entries[invocation] += " " + line.strip()
    return " ".join(usage.split()), entries


@pytest.mark.parametrize("name", FLAG_COMMANDS)
def test_help_pages_show_flags_as_the_docs_write_them(name, capsys):
    usage, entries = help_text([name], capsys)
    assert len(entries) >= 3  # --help and the command's own flags
    assert not re.search(r"--\w+_\w+", usage), usage  # the dashed spelling (the underscore one still parses)
    assert not re.search(r"\[--[\w-]+ \[[A-Z_]+\]\]", usage), usage  # an on/off setting is a bare flag
    required = set(re.findall(r"(?<!\[)(--[\w-]+) [A-Z_]+", usage.replace(" | ", "|")))
    for invocation, text in entries.items():
        flag = invocation.split()[0].rstrip(",")
        assert text.lower().count("default") <= 1, f"{invocation}: {text}"
        assert "(default: None)" not in text and "(default: False)" not in text, f"{invocation}: {text}"
        assert (flag in required) == text.endswith("(required)"), f"{invocation}: {text}"
        assert not (flag in required and "default" in text.lower()), f"{invocation}: {text}"
        assert "_" not in invocation.split(" ", 1)[0], invocation


def test_on_off_settings_parse_as_flags_in_both_spellings():
    from trims_hf.commands.eval import parser

    def parsed(*flags: str):
        _, args, decoding, _ = parser().parse(["--model", "m", "--task", "gsm8k", "--output", "o.json", *flags])
        return args.progress, decoding.early_stop, args.allow_code_execution

    assert parsed() == (True, True, False)
    assert parsed("--no-progress", "--no-early-stop", "--allow-code-execution") == (False, False, True)
    assert parsed("--no_progress", "--no_early_stop", "--allow_code_execution") == (False, False, True)
    with pytest.raises(SystemExit):
        parser().parse(["--model", "m", "--task", "gsm8k", "--output", "o.json", "--allow-code-execution", "true"])


@pytest.mark.parametrize("preset,expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_commands_let_waiting_threads_sleep_unless_the_user_chose(preset, expected, monkeypatch, capsys):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if preset:
        monkeypatch.setenv("OMP_WAIT_POLICY", preset)
    assert main(["export", "--help"]) == 0
    assert os.environ["OMP_WAIT_POLICY"] == expected


@pytest.mark.slow
@needs_deepspeed
def test_deepspeed_is_told_it_runs_on_the_cpu_and_says_nothing_about_it():
    code = "import sys; from trims_hf.distributed import name_cpu_accelerator; {} import deepspeed"
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    runs = {named: subprocess.run([sys.executable, "-c", code.format("name_cpu_accelerator();" if named else "")],
                                  capture_output=True, text=True, timeout=120, env=env) for named in (True, False)}
    assert all(run.returncode == 0 for run in runs.values()), runs
    assert "unable to detect" not in runs[True].stdout + runs[True].stderr
    import torch

    if not torch.cuda.is_available():  # left to guess on a CPU machine, DeepSpeed says it could not find a GPU
        assert "unable to detect" in runs[False].stdout + runs[False].stderr


def raising_command(argv):
    raise RuntimeError("the command failed")


@pytest.mark.parametrize("argv", [["export", "--help"], ["eval", "--model", "/no/such/student", "--task", "gsm8k",
                                                         "--output", "unused.json"], ["boom"]],
                         ids=["help", "input-error", "exception"])
def test_a_command_that_ends_leaves_the_process_group_it_ran_in_and_one_that_raises_does_not(argv, tmp_path,
                                                                                             monkeypatch):
    """A gloo group left to interpreter exit can abort a finished process, so a command that ends (its exit code,
    usage errors included) leaves it; one that raises leaves the group to the launcher, as other processes may
    still wait in a collective."""
    import types

    import torch.distributed as dist
    from helpers_launch import free_port

    from trims_hf import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "raising_command", types.SimpleNamespace(main=raising_command))
    monkeypatch.setitem(cli.COMMANDS, "boom", ("raising_command", "fails"))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        if argv == ["boom"]:
            with pytest.raises(RuntimeError, match="the command failed"):
                main(argv)
            assert dist.is_initialized()
        else:
            assert main(argv) in (0, 2)
            assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_an_output_may_lie_inside_a_models_folder_but_never_be_it_or_hold_it(tmp_path):
    """A run's checkpoints and a merged export lie inside a model's or adapter's folder harmlessly; an output that is
    the input or holds it would replace it. Inside data, an output would become part of the data."""
    from trims_hf.errors import InputError, check_apart

    (tmp_path / "run").mkdir()
    check_apart(tmp_path / "run" / "merged", "--output o", str(tmp_path / "run"), "--adapter a", "a model", inside=True)
    check_apart(tmp_path / "elsewhere", "--output o", str(tmp_path / "run"), "--adapter a", "a model", inside=True)
    check_apart(tmp_path / "run", "--output o", "org/run", "--adapter org/run", "a model")  # a Hub id: no folder here
    for output, relation in ((tmp_path / "run", "is"), (tmp_path, "holds")):
        with pytest.raises(InputError, match=f"^--output o {relation} --adapter a, a model it is made from; write it to "
                                             "a folder apart.$"):
            check_apart(output, "--output o", str(tmp_path / "run"), "--adapter a", "a model", inside=True)
    with pytest.raises(InputError, match="^--output o lies inside --dataset d, the data it is made from; "):
        check_apart(tmp_path / "run" / "scored", "--output o", str(tmp_path / "run"), "--dataset d")


def test_an_output_file_may_exist_and_is_checked_in_its_folder(tmp_path):
    from trims_hf.errors import InputError, check_output_path

    existing = tmp_path / "results.json"
    existing.write_text("{}")
    assert check_output_path(existing, "--output r", folder=False) == existing  # a rerun replaces it
    assert check_output_path(tmp_path / "new" / "r.json", "--output r", folder=False) == tmp_path / "new" / "r.json"
    with pytest.raises(InputError, match=f"^--output r: {existing} is a file, not a folder.$"):
        check_output_path(existing / "r.json", "--output r", folder=False)
    with pytest.raises(InputError, match="^--output r: a folder; name the file to write.$"):
        check_output_path(tmp_path, "--output r", folder=False)
    with pytest.raises(InputError, match="^--output r: a file, not a folder.$"):
        check_output_path(existing, "--output r")
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "locked").mkdir(mode=0o500)
        (tmp_path / "locked" / "r.json").write_text("{}")
        with pytest.raises(InputError, match="locked is not writable"):
            check_output_path(tmp_path / "locked" / "r.json", "--output r", folder=False)


@pytest.mark.slow  # a fresh interpreter importing torch
def test_an_input_file_of_another_format_is_named_and_any_other_name_is_read(tmp_path):
    """Readers of text rows read content, not names: a file is refused only when its type is a known other format
    that none of the reader's suffixes names."""
    from trims_hf.errors import InputError, check_input_file

    for name in ("rows.jsonl", "rows.ndjson", "ROWS.JSONL", "rows", "rows.txt", "HumanEval.jsonl.gz"):
        (tmp_path / name).write_text("")
    for name in ("rows.jsonl", "rows.ndjson", "ROWS.JSONL", "rows", "rows.txt"):
        check_input_file(tmp_path / name, "--data-file x", (".jsonl", ".json"))
    check_input_file(tmp_path / "HumanEval.jsonl.gz", "--data-file x", (".jsonl", ".jsonl.gz"))
    for name in ("rows.csv", "ROWS.PARQUET", "HumanEval.jsonl.gz"):
        (tmp_path / name).write_text("")
        with pytest.raises(InputError, match=rf"^--data-file x: unsupported file type '{re.escape(Path(name).suffix)}' "
                                             r"\(use \.jsonl, \.json\)\.$"):
            check_input_file(tmp_path / name, "--data-file x", (".jsonl", ".json"))


def test_every_public_name_is_what_it_names_whatever_was_imported_first():
    """Each name in ``trims_hf.__all__`` resolves to the object its module defines, in a fresh interpreter where every
    submodule was imported first: no submodule shares a public name and replaces it (``trims_hf.export`` the
    function, not the module that defines it)."""
    script = ("import importlib, trims_hf\n"
              "for module in sorted(trims_hf._EXPORTS): importlib.import_module('trims_hf.' + module)\n"
              "wrong = [name for name in trims_hf.__all__ if getattr(trims_hf, name) is not getattr(\n"
              "    importlib.import_module('trims_hf.' + trims_hf._OWNER[name]), name)]\n"
              "print(wrong)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
    assert callable(importlib.import_module("trims_hf").export)


def test_ctrl_c_a_command_does_not_report_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C while a command imports its libraries (before its own handlers run) was a 30-line traceback."""
    import trims_hf.studies.demo.command as demo

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "main", interrupted)
    assert main(["demo", "--fast"]) == 130
    assert capsys.readouterr().err == "error: interrupted: `trims demo` stopped before it finished.\n"
