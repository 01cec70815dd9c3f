"""Find the regime where TRIMS can be judged, on the MDLM base alone, then run the seed study there (docs/regime.md).

  curve  the MDLM base alone over student size, batch and base steps, probed on every difficulty level, cheapest
         first; the pre-registered rule picks the cheapest setting whose base reaches the target with long, mixed
         answers (writes curve.jsonl, curve.md, curve.png, choice.json)
  study  MDLM and the three TRIMS orderings from one base per seed in the chosen regime, every threshold, and the
         pre-registered reading (writes report/study.md, report/study.json)
  copies whether a base computes its solution lines' results or copies them from where the answer repeats them
         (one JSON line: each result read with the rest visible, with the later numbers masked, left to right)
  mechanism  what a study's trajectory rows taught: every model's confidence on the future buckets with the context
         buckets revealed and with everything masked, each variant against MDLM per seed (report/mechanism.md)

Both resume: a rerun skips finished points and units. The library does the work (trims_hf.studies.regime).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from trims_hf.determinism import sleep_while_waiting

if TYPE_CHECKING:
    from trims_hf.studies.regime import RegimeProtocol

sleep_while_waiting()  # before torch loads: two shared cores

SMOKE = ("levels=1", "train_per_level=48", "selection_per_level=6", "test_problems=8", "pretrain_steps=20",
         "variant_steps=2", "eval_batch_size=4", "trace_samples=2", "thresholds=0.5,0.9", "masking.num_buckets=4")
"""``--smoke``: every stage on tiny sizes in seconds (nothing is learned)."""


class Parser(argparse.ArgumentParser):
    """A usage mistake as one ``error:`` line and exit code 2, as every other input error here."""

    def error(self, message: str) -> NoReturn:
        from trims_hf.errors import InputError

        raise InputError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> Parser:
    """One subcommand per job, each with its own flags (``regime.py curve --help`` lists the curve's alone)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="A protocol setting (trims_hf.studies.regime.RegimeProtocol), e.g. hidden_size=128 or "
                        "test_level=2.")
    common.add_argument("--smoke", action="store_true", help="Tiny sizes: every stage runs in seconds.")
    parser = Parser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    summary: dict[str, str] = {}  # each command's paragraph of the module docstring
    for line in __doc__.split("\n\n")[1].splitlines():
        if line[2] != " ":
            command, text = line.split(None, 1)
            summary[command] = text
        else:
            summary[command] += " " + line.strip()

    curve = commands.add_parser("curve", parents=[common], help=summary["curve"], description=summary["curve"])
    curve.add_argument("--output", type=Path, help="Folder (reruns resume here).")
    curve.add_argument("--budget-minutes", type=float, help="Start no point after this.")
    curve.add_argument("--sizes", nargs="+", default=["64x4x4", "128x4x4"], help="HIDDENxLAYERSxHEADS each.")
    curve.add_argument("--batch-sizes", nargs="+", type=int, default=[16, 32], help="Base batch sizes.")
    curve.add_argument("--base-steps", nargs="+", type=int, default=[500, 1000, 2000], help="Base MDLM steps.")
    curve.add_argument("--pretrain-steps", nargs="+", type=int, default=[],
                       help="Autoregressive steps of the pretrained model (the student's start, the teacher; default: "
                       "the protocol's, 400).")
    curve.add_argument("--base-lrs", nargs="+", type=float, default=[],
                       help="The base's learning rates (default: the protocol's, 1e-3).")
    curve.add_argument("--anneal-fractions", nargs="+", type=float, default=[],
                       help="Shares of the base's steps over which its attention anneals from causal to bidirectional "
                       "(DiffuLLaMA; 0: at once; default: the protocol's anneal_steps, 0).")

    study = commands.add_parser("study", parents=[common], help=summary["study"], description=summary["study"])
    study.add_argument("--output", type=Path, help="Folder (reruns resume here).")
    study.add_argument("--budget-minutes", type=float,
                       help="Start no unit expected to end after this (exit 3, rerun to continue).")
    study.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="One base per seed.")
    study.add_argument("--from-curve", type=Path, help="Run in the point a curve folder's rule chose (the settings the "
                       "curve ran with, then its size, pretrained model, batch, steps and level); --set then changes "
                       "the rest.")
    study.add_argument("--reuse", type=Path, help="Another study's folder whose finished stages up to each seed's base "
                       "and probe are taken wherever they were made under this study's settings for them (e.g. a study "
                       "at another trajectory ratio trains no base again).")

    copies = commands.add_parser("copies", parents=[common], help=summary["copies"], description=summary["copies"])
    copies.add_argument("--model", type=Path, help="A base's folder (a point's <size>/base).")
    copies.add_argument("--rows", type=Path, help="Question/answer rows (a point's <size>/data/selection-L1.jsonl) or "
                        "prompt/completion rows (its data/train.jsonl).")
    copies.add_argument("--limit", type=int, default=100, help="The first N rows (default 100).")

    mechanism = commands.add_parser("mechanism", parents=[common], help=summary["mechanism"],
                                    description=summary["mechanism"])
    mechanism.add_argument("--output", type=Path, help="A study's folder, its --set and --from-curve repeated.")
    mechanism.add_argument("--from-curve", type=Path, help="The curve folder the study ran in (as its --from-curve).")
    mechanism.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="The study's seeds.")
    mechanism.add_argument("--problems", type=int, default=200, help="The first N test problems (default 200).")
    return parser


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, object]:
    args = build_parser().parse_args(argv)
    from trims_hf.errors import InputError, check_output_path
    from trims_hf.studies.protocol import with_overrides
    from trims_hf.studies.regime import RegimeProtocol

    try:
        protocol = with_overrides(RegimeProtocol(), [*(SMOKE if args.smoke else ()), *args.set])
    except ValueError as error:
        raise InputError(f"--set {error}") from None
    if getattr(args, "from_curve", None) is not None:
        from trims_hf.studies.regime import check_shared, chosen_protocol, pretrained_tag, read_curve

        curve = args.from_curve / "curve.jsonl"
        if not curve.is_file():
            raise InputError(f"--from-curve {args.from_curve}: no curve.jsonl there.")
        try:
            protocol = with_overrides(chosen_protocol(protocol, read_curve(curve)), args.set)
            check_shared(args.from_curve / pretrained_tag(protocol), protocol)
        except ValueError as error:
            raise InputError(f"--from-curve {args.from_curve}: {error}") from None
    if args.command == "copies":
        for flag, path, kind in (("--model", args.model, "dir"), ("--rows", args.rows, "file")):
            if path is None or not (path.is_dir() if kind == "dir" else path.is_file()):
                raise InputError(f"{flag} {path}: copies needs an existing {'folder' if kind == 'dir' else 'file'}.")
        if args.limit < 1:
            raise InputError(f"--limit {args.limit}: must be at least 1.")
        from trims_hf.evaluation.tasks.base import TaskDataError, read_json_rows
        from trims_hf.studies.arith import ArithTask
        from trims_hf.studies.regime import RESULT

        try:
            args.rows_read = [{"question": row["prompt"], "answer": row["completion"]} if "question" not in row
                              and {"prompt", "completion"} <= row.keys() else row
                              for row in read_json_rows(args.rows)[: args.limit]]  # a study's data/train.jsonl too
            ArithTask(args.rows_read, name=f"--rows {args.rows}").load()
        except (TaskDataError, ValueError) as error:
            raise InputError(str(error)) from None
        if not any(RESULT.search(row["answer"]) for row in args.rows_read):
            raise InputError(f"--rows {args.rows}: no answer has a solution line with a result ('= N') to read")
        return args, protocol
    if args.output is None:
        raise InputError(f"{args.command} needs --output FOLDER.")
    if args.command == "mechanism":
        if args.problems < 1:
            raise InputError(f"--problems {args.problems}: must be at least 1.")
        if missing := [seed for seed in args.seeds if not (args.output / f"seed-{seed}" / "variants").is_dir()]:
            raise InputError(f"--output {args.output}: no trained models of seed {missing[0]} there (seed-{missing[0]}"
                             f"/variants); run the study first, or name its --seeds.")
        return args, protocol
    if args.command == "curve":
        check_grid(args)
    if args.budget_minutes is not None and args.budget_minutes <= 0:
        raise InputError(f"--budget-minutes {args.budget_minutes}: must be positive.")
    check_output_path(args.output, f"--output {args.output}")
    if args.command == "study" and args.reuse is not None and not any((args.reuse / f"seed-{s}").is_dir()
                                                                      for s in args.seeds):
        raise InputError(f"--reuse {args.reuse}: no seed-<s> folder of seeds {' '.join(map(str, args.seeds))} there.")
    return args, protocol


def check_grid(args: argparse.Namespace) -> None:
    """The curve's grid flags, each a one-line InputError; ``--sizes`` parsed into (hidden, layers, heads) triples."""
    from trims_hf.errors import InputError
    from trims_hf.studies.protocol import check_head_width

    sizes = [tuple(int(v) for v in size.split("x") if v.isdigit()) for size in args.sizes]
    if any(len(size) != 3 or min(size) < 1 or len(text.split("x")) != 3 for size, text in zip(sizes, args.sizes)):
        raise InputError(f"--sizes {' '.join(args.sizes)}: expected HIDDENxLAYERSxHEADS, e.g. 64x4x4.")
    for (hidden, _, heads), text in zip(sizes, args.sizes):
        try:
            check_head_width(hidden, heads)
        except ValueError as error:
            raise InputError(f"--sizes {text}: {error}") from None
    args.sizes = sizes
    for flag, values in (("--batch-sizes", args.batch_sizes), ("--base-steps", args.base_steps),
                         ("--pretrain-steps", args.pretrain_steps)):
        if values and min(values) < 1:
            raise InputError(f"{flag} {min(values)}: must be at least 1.")
    for flag, values, low in (("--base-lrs", args.base_lrs, 0.0), ("--anneal-fractions", args.anneal_fractions, -1e-12)):
        if values and not all(low < v <= 1 for v in values):
            raise InputError(f"{flag} {' '.join(map(str, values))}: each must lie in {'(0' if low == 0 else '[0'}, 1].")


def main(argv: Sequence[str] | None = None) -> int:
    """0 done, 2 bad input, 3 stopped for time, 130 interrupted (Ctrl-C); rerun to continue."""
    start = time.monotonic()
    from trims_hf.errors import InputError

    try:
        args, protocol = parse(argv)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import torch

    from trims_hf.commands import INTERRUPTED
    from trims_hf.studies import regime
    from trims_hf.studies.units import StudyInterrupted

    torch.set_num_threads(protocol.threads)
    if args.command == "copies":
        from transformers import AutoTokenizer

        from trims_hf import load_student

        try:
            model, tokenizer = load_student(str(args.model)).eval(), AutoTokenizer.from_pretrained(args.model)
        except (OSError, ValueError) as error:
            print(f"error: --model {args.model}: not a student folder ({str(error).splitlines()[0]})", file=sys.stderr)
            return 2
        recall = regime.result_recall(model, tokenizer, args.rows_read, protocol.student_format)
        print(json.dumps({"model": str(args.model), **recall}))
        return 0
    if args.command == "mechanism":
        try:
            print(regime.write_mechanism_report(args.output, protocol, args.seeds, args.problems).read_text())
        except ValueError as error:
            print(f"error: --output {args.output}: {error}", file=sys.stderr)
            return 2
        return 0
    args.output.mkdir(parents=True, exist_ok=True)
    budget = float("inf") if args.budget_minutes is None else 60 * args.budget_minutes
    try:
        return run_studies(args, protocol, start, budget)
    except KeyboardInterrupt as stop:  # inside a study, it says where; between two, the finished ones are kept
        where = str(stop) if isinstance(stop, StudyInterrupted) else \
            f"between studies; their finished units are kept in {args.output}: run the same command again to continue."
        print(f"error: interrupted {where}", file=sys.stderr)
        return INTERRUPTED


def run_studies(args: argparse.Namespace, protocol: RegimeProtocol, start: float, budget: float) -> int:
    """``curve`` or ``seeds``: the studies themselves (``budget`` seconds: the curve's from its start, the seeds' from
    ``start``), their reports written and printed."""
    from trims_hf.reports import write_atomic
    from trims_hf.studies import regime

    if args.command == "curve":
        grid = regime.CurveGrid(tuple(args.sizes), tuple(args.batch_sizes), tuple(args.base_steps),
                                tuple(args.pretrain_steps), tuple(args.base_lrs), tuple(args.anneal_fractions))
        rows = regime.run_curve(args.output, protocol, grid, budget)
        table = regime.format_curve(rows, protocol)
        write_atomic(args.output / "curve.md", table)
        write_atomic(args.output / "choice.json", json.dumps(regime.choose(rows, protocol), indent=1))
        if rows:
            regime.plot_curve(rows, args.output / "curve.png")
        print("\n" + table)
        return 0
    shared = args.from_curve / regime.pretrained_tag(protocol) if args.from_curve is not None else None
    finished = regime.run_seeds(args.output, protocol, args.seeds, start + budget, shared, args.reuse)
    print("\n" + regime.write_seed_report(args.output, protocol, args.seeds).read_text())
    return 0 if finished else 3


if __name__ == "__main__":
    sys.exit(main())
