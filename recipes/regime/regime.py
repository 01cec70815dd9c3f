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

Both resume: a rerun skips finished points and units. The library does the work (trims_hf.regime).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from trims_hf.determinism import sleep_while_waiting

sleep_while_waiting()  # before torch loads: two shared cores

SMOKE = ("levels=1", "train_per_level=48", "selection_per_level=6", "test_problems=8", "pretrain_steps=20",
         "variant_steps=2", "eval_batch_size=4", "trace_samples=2", "thresholds=0.5,0.9", "masking.num_buckets=4")
"""``--smoke``: every stage on tiny sizes in seconds (nothing is learned)."""


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("curve", "study", "copies", "mechanism"))
    parser.add_argument("--output", type=Path, help="curve, study: folder (reruns resume here); mechanism: a study's "
                        "folder, its --set settings repeated.")
    parser.add_argument("--model", type=Path, help="copies: a base's folder (a point's <size>/base).")
    parser.add_argument("--rows", type=Path, help="copies: question/answer rows (a point's <size>/data/selection-L1.jsonl) "
                        "or prompt/completion rows (its data/train.jsonl).")
    parser.add_argument("--limit", type=int, default=100, help="copies: the first N rows (default 100).")
    parser.add_argument("--problems", type=int, default=200, help="mechanism: the first N test problems (default 200).")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="A protocol setting (trims_hf.regime.RegimeProtocol), e.g. hidden_size=128 or test_level=2.")
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes: every stage runs in seconds.")
    parser.add_argument("--budget-minutes", type=float, help="curve: start no point after this; study: no unit "
                        "expected to end after it (exit 3, rerun to continue).")
    parser.add_argument("--sizes", nargs="+", default=["64x4x4", "128x4x4"], help="curve: HIDDENxLAYERSxHEADS each.")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[16, 32], help="curve: base batch sizes.")
    parser.add_argument("--base-steps", nargs="+", type=int, default=[500, 1000, 2000], help="curve: base MDLM steps.")
    parser.add_argument("--pretrain-steps", nargs="+", type=int, default=[],
                        help="curve: autoregressive steps of the pretrained model (the student's start, the teacher; "
                        "default: the protocol's, 400).")
    parser.add_argument("--base-lrs", nargs="+", type=float, default=[], help="curve: the base's learning rates "
                        "(default: the protocol's, 1e-3).")
    parser.add_argument("--anneal-fractions", nargs="+", type=float, default=[],
                        help="curve: shares of the base's steps over which its attention anneals from causal to "
                        "bidirectional (DiffuLLaMA; 0: at once; default: the protocol's anneal_steps, 0).")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="study: one base per seed.")
    parser.add_argument("--from-curve", type=Path, help="study: run in the point a curve folder's rule chose (the "
                        "settings the curve ran with, then its size, pretrained model, batch, steps and level); --set then "
                        "changes the rest.")
    parser.add_argument("--reuse", type=Path, help="study: another study's folder whose finished stages up to each "
                        "seed's base and probe are taken wherever they were made under this study's settings for them "
                        "(e.g. a study at another trajectory ratio trains no base again).")
    args = parser.parse_args(argv)
    from trims_hf.errors import InputError, check_output_path
    from trims_hf.protocol import with_overrides
    from trims_hf.regime import RegimeProtocol

    if args.reuse is not None and args.command != "study":
        raise InputError(f"--reuse {args.reuse}: only the study takes another study's stages.")

    try:
        protocol = with_overrides(RegimeProtocol(), [*(SMOKE if args.smoke else ()), *args.set])
    except ValueError as error:
        raise InputError(f"--set {error}") from None
    if args.from_curve is not None:
        from trims_hf.regime import check_shared, chosen_protocol, pretrained_tag, read_curve

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
        from trims_hf.regime import RESULT
        from trims_hf.tasks.arith import ArithTask
        from trims_hf.tasks.base import TaskDataError, read_json_rows

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
    sizes = [tuple(int(v) for v in size.split("x") if v.isdigit()) for size in args.sizes]
    if any(len(size) != 3 or min(size) < 1 or len(text.split("x")) != 3 for size, text in zip(sizes, args.sizes)):
        raise InputError(f"--sizes {' '.join(args.sizes)}: expected HIDDENxLAYERSxHEADS, e.g. 64x4x4.")
    args.sizes = sizes
    for flag, values in (("--batch-sizes", args.batch_sizes), ("--base-steps", args.base_steps),
                         ("--pretrain-steps", args.pretrain_steps)):
        if values and min(values) < 1:
            raise InputError(f"{flag} {min(values)}: must be at least 1.")
    for flag, values, low in (("--base-lrs", args.base_lrs, 0.0), ("--anneal-fractions", args.anneal_fractions, -1e-12)):
        if values and not all(low < v <= 1 for v in values):
            raise InputError(f"{flag} {' '.join(map(str, values))}: each must lie in {'(0' if low == 0 else '[0'}, 1].")
    if args.budget_minutes is not None and args.budget_minutes <= 0:
        raise InputError(f"--budget-minutes {args.budget_minutes}: must be positive.")
    check_output_path(args.output, f"--output {args.output}")
    if args.reuse is not None and not any((args.reuse / f"seed-{seed}").is_dir() for seed in args.seeds):
        raise InputError(f"--reuse {args.reuse}: no seed-<s> folder of seeds {' '.join(map(str, args.seeds))} there.")
    return args, protocol


def main(argv: Sequence[str] | None = None) -> int:
    """0 done, 2 bad input, 3 stopped for time (rerun to continue)."""
    start = time.monotonic()
    from trims_hf.errors import InputError

    try:
        args, protocol = parse(argv)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import torch

    from trims_hf import regime
    from trims_hf.reports import write_atomic

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
