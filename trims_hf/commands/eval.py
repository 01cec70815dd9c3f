"""``trims eval``: decode a benchmark with a student and report accuracy and tokens per step (JSON, table, plot).

Inputs are checked before the model loads, so a typo costs seconds, not a model load.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..evaluation import check_task_inputs, evaluate_task, format_table, plot_frontier, sweep
from ..generation import DecodingConfig
from ..generation.cache import CACHE_MODES
from ..students import load_student
from ..tasks import CodeExecutionDisabled, TaskDataError, get_task, registry

STRATEGIES = ("threshold", "fixed_steps", "entropy", "factor")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="Evaluate a student on a benchmark: accuracy and tokens per step.")
    parser.add_argument("--model", required=True, help="Hub id or folder of the student (LLaDA, Dream, masked LM).")
    parser.add_argument("--adapter", help="Hub id or folder of a peft adapter to load on top of --model.")
    parser.add_argument("--tokenizer", help="Tokenizer id or folder (default: --model).")
    parser.add_argument("--task", required=True, choices=sorted(registry))
    parser.add_argument("--mbpp-style", choices=("instruct", "3shot"), default="instruct",
                        help="MBPP prompt: the instruction with its asserts, or the classic 3-shot [BEGIN]...[DONE] format.")
    parser.add_argument("--data-file", help="Local JSON/JSONL copy of the benchmark (default: the Hub data set).")
    parser.add_argument("--limit", type=int, help="Evaluate only the first N examples.")
    parser.add_argument("--allow-code-execution", action="store_true",
                        help="Run model-written code in the sandbox (needed for humaneval and mbpp).")
    parser.add_argument("--strategy", choices=STRATEGIES, default="threshold")
    parser.add_argument("--threshold", type=float, default=0.9, help="Confidence threshold tau (threshold strategy).")
    parser.add_argument("--entropy-threshold", type=float, default=0.5, help="Entropy threshold (entropy strategy).")
    parser.add_argument("--factor", type=float, default=1.0, help="f of the factor strategy.")
    parser.add_argument("--steps", type=int, help="Total steps of fixed_steps (default: --gen-length).")
    parser.add_argument("--gen-length", type=int, default=256)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--cache", choices=CACHE_MODES, default="none")
    parser.add_argument("--no-early-stop", dest="early_stop", action="store_false",
                        help="Keep decoding blocks after an EOS (early stop is on by default).")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--sweep", help="Comma-separated values of the strategy's knob, e.g. 0.5,0.7,0.9,0.95; "
                                        "prints the table and writes the frontier PNG next to --output.")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), help="Model weights dtype.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output", required=True, help="JSON file to write the result(s) to.")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    parser.set_defaults(func=run)


def decoding_config(args: argparse.Namespace) -> DecodingConfig:
    return DecodingConfig(
        strategy=args.strategy, threshold=args.threshold, entropy_threshold=args.entropy_threshold, factor=args.factor,
        steps=args.steps, gen_length=args.gen_length, block_length=args.block_length, cache=args.cache,
        early_stop=args.early_stop,
    )


def load_model(args: argparse.Namespace) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The student (with its adapter, if any) in eval mode on ``--device``, and its tokenizer."""
    dtype = {} if args.dtype is None else {"dtype": args.dtype}
    model = load_student(args.model, **dtype)
    if args.adapter:
        model = PeftModel.from_pretrained(model, args.adapter)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    return model.to(args.device).eval(), tokenizer


def run(args: argparse.Namespace) -> int:
    try:
        task = get_task(args.task, style=args.mbpp_style) if args.task == "mbpp" else get_task(args.task)
        config = decoding_config(args)
        values = [float(v) for v in args.sweep.split(",")] if args.sweep else None
        check_task_inputs(task, args.data_file, args.allow_code_execution)
    except (ValueError, FileNotFoundError, CodeExecutionDisabled) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model, tokenizer = load_model(args)
    name = args.model + (f" + {args.adapter}" if args.adapter else "")
    options = dict(limit=args.limit, data_file=args.data_file, execute_code=args.allow_code_execution,
                   batch_size=args.batch_size, progress=args.progress, model_name=name)
    try:
        if values is None:
            results = [evaluate_task(model, tokenizer, task, config, **options)]
        else:
            results = sweep(model, tokenizer, task, values, config, **options)
    except TaskDataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    payload = results[0].to_dict() if values is None else {"results": [r.to_dict() for r in results]}
    output.write_text(json.dumps(payload, indent=2))
    print(format_table(results))
    if values is not None:
        plot_frontier(results, output.with_suffix(".png"))
        print(f"Frontier plot written to {output.with_suffix('.png')}")
    print(f"Results written to {output}")
    return 0
