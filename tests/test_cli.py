"""The `trims` command: help for every sub-command imports only that command's dataclasses (fast `--help`);
no or an unknown command is one error line."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest

from trims_hf.cli import COMMANDS, main

HEAVY = ("trims_hf.trainer", "trims_hf.generation.decoding", "trims_hf.harness.model", "trims_hf.jobs.score",
         "trims_hf.jobs.train", "trims_hf.demo.pipeline", "peft", "datasets")


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
