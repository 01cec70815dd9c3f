"""``python -m trims_hf.evaluation.harness <lm_eval flags>``: lm-evaluation-harness with the ``trims`` model.

Every flag is the harness's own (its ``run`` parser reads them); this entry only registers the model,
puts the ``*_local`` task folder on ``--include_path`` when the user gave none, checks local data, the task names and
the ``trims`` model's arguments before any model loads (a mistake is one ``error:`` line, exit code 2, as in every
``trims`` command), and after the run writes ``trims_<stamp>.json`` next to each new
``results_<stamp>.json``: the tokens-per-step figures and decoding settings of ``config.trims`` (under
``accelerate launch``, once, by the main process, with every process's counts).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ...commands import fail
from ...errors import InputError, did_you_mean, one_line
from . import LOCAL_FILES, TASKS_DIR, data_file


def _flag(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``argv`` (the last one), else None."""
    value = None
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def _check_local_data(argv: Sequence[str]) -> None:
    """Fail in one line, before the model loads, when a ``*_local`` task has no data folder."""
    metadata = json.loads(_flag(argv, "--metadata") or "{}")
    data_dir = metadata.get("data_dir") if isinstance(metadata, dict) else None
    for task in (_flag(argv, "--tasks") or "").split(","):
        if task.endswith("_local"):
            prefix = next((p for p in LOCAL_FILES if task.startswith(p)), None)
            for name in LOCAL_FILES.get(prefix, {}).values():
                data_file(name, data_dir)


def _results_files(output_path: str | None) -> set[Path]:
    if output_path is None:
        return set()
    root = Path(output_path)
    folder = root.parent if root.suffix == ".json" else root
    return set(folder.rglob("*.json")) if folder.is_dir() else set()


def write_trims_files(results_files: Sequence[Path]) -> list[Path]:
    """Next to each harness results file, ``trims_<stamp>.json`` with its ``config.trims`` block."""
    written = []
    for path in results_files:
        results = json.loads(path.read_text())
        trims = results.get("config", {}).get("trims")
        if trims is None:
            continue
        target = path.with_name(path.name.replace("results_", "trims_", 1) if path.name.startswith("results_")
                                else f"trims_{path.name}")
        summary = {"results_file": path.name, "model_args": results["config"].get("model_args"), **trims}
        target.write_text(json.dumps(summary, indent=2, default=str))
        written.append(target)
    return written


def _check_run(args: argparse.Namespace) -> None:
    """The tasks exist and the ``trims`` model's arguments hold, before the harness loads any model (it resolves the
    tasks first, but its own errors are tracebacks, and the model's are found only when it is built)."""
    from lm_eval.tasks import TaskManager

    tasks = [task for text in ([args.tasks] if isinstance(args.tasks, str) else args.tasks or [])
             for task in text.split(",") if task and not task.endswith(".yaml") and not Path(task).is_dir()]
    if tasks:
        # The harness indexes every task YAML it ships (about 15 s) when it runs; tasks found on the include path
        # alone (the *_local ones) are checked without a second full index.
        manager = TaskManager(include_path=args.include_path, include_defaults=False)
        if any(not manager.match_tasks([task]) for task in tasks):
            manager = TaskManager(include_path=args.include_path)
        if missing := [task for task in tasks if not manager.match_tasks([task])]:
            raise InputError(f"--tasks {missing[0]}: no such task{did_you_mean(missing[0], manager.all_tasks)} "
                             "(`lm-eval ls tasks` lists them).")
    if args.model == "trims":
        from .model import check_model_args

        batch = {"batch_size": args.batch_size} if getattr(args, "batch_size", None) is not None else {}
        try:
            check_model_args({**batch, **(args.model_args or {})})
        except InputError as error:
            raise InputError(f"--model_args: {error}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the harness CLI on ``argv`` (default: the command line) with the trims model registered; the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _check_local_data(argv)
    except FileNotFoundError as error:
        return fail(one_line(error))
    if _flag(argv, "--include_path") is None:
        argv += ["--include_path", str(TASKS_DIR)]
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    if not {"-h", "--help"} & set(argv):  # help needs no model class: keep it as fast as the harness's own
        from . import model  # noqa: F401  (registers "trims")

    setup_logging()
    harness = HarnessCLI()
    saved_argv, sys.argv = sys.argv, ["lm-eval", *argv]
    try:
        args = harness.parse_args()  # as the harness's own command line (it inserts its `run` command)
    finally:
        sys.argv = saved_argv
    running = getattr(args, "command", None) == "run"
    try:
        if running:
            _check_run(args)
    except InputError as error:
        return fail(one_line(error))
    output_path = _flag(argv, "--output_path")
    before = _results_files(output_path)
    try:
        harness.execute(args)
    except InputError as error:
        return fail(one_line(error))
    except ConnectionError as error:  # a task's data set, downloaded once the model is built
        return fail(f"--tasks {','.join(args.tasks) if isinstance(args.tasks, list) else args.tasks}: a task's data "
                    f"could not be fetched ({one_line(error)}); connect to the Hugging Face Hub, or run with the data "
                    "set in the Hugging Face cache and HF_DATASETS_OFFLINE=1, or use a *_local task with "
                    "TRIMS_HARNESS_DATA (docs/evaluation.md).")
    from ...distributed import process_state

    if not running or not process_state().is_main_process:  # the main process writes the results file, and ours
        return 0
    new = sorted(p for p in _results_files(output_path) - before if not p.name.startswith("trims_"))
    for path in write_trims_files(new):
        print(f"trims tokens per step and decoding settings: {path}")
    return 0


if __name__ == "__main__":
    from ...cli import leave_process_group

    code = main()
    leave_process_group()
    sys.exit(code)
