"""``trims eval``: decode a benchmark with a student and report accuracy and tokens per step (JSON, table, plot).

Flags come from :class:`EvalArguments`, :class:`~trims_hf.settings.DecodingConfig` and
:class:`~trims_hf.settings.PromptFormat`. Inputs are checked before the model loads, so a typo costs
seconds, not a model load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..settings import DecodingConfig, PromptFormat
from . import CommandParser, fail


@dataclass
class EvalArguments:
    """What to evaluate, on which benchmark, and where the results go."""

    model: str = field(metadata={"help": "Hub id or folder of the student (LLaDA, Dream, masked LM)."})
    task: str = field(metadata={"help": "Benchmark: gsm8k, math500, humaneval or mbpp."})
    output: str = field(metadata={"help": "JSON file to write the result(s) to."})
    adapter: str | None = field(default=None, metadata={"help": "Hub id or folder of a peft adapter to load on top of --model."})
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer id or folder (default: --model)."})
    mbpp_style: Literal["instruct", "3shot"] = field(
        default="instruct",
        metadata={"help": "MBPP prompt: the instruction with its asserts, or the classic 3-shot [BEGIN]...[DONE] format."},
    )
    data_file: str | None = field(default=None, metadata={"help": "Local JSON/JSONL copy of the benchmark (default: the Hub data set)."})
    limit: int | None = field(default=None, metadata={"help": "Evaluate only the first N examples."})
    allow_code_execution: bool = field(
        default=False, metadata={"help": "Run model-written code in the sandbox (needed for humaneval and mbpp)."}
    )
    batch_size: int = field(default=1, metadata={"help": "Prompts decoded together (left-padded)."})
    sweep: str | None = field(
        default=None,
        metadata={"help": "Comma-separated values of the strategy's knob, e.g. 0.5,0.7,0.9,0.95; prints the table and "
                  "writes the frontier PNG next to --output."},
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = field(default=None, metadata={"help": "Model weights dtype."})
    device: str | None = field(default=None, metadata={"help": "Device to decode on (default: cuda when available, else cpu)."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})


def main(argv: list[str]) -> int:
    parser = CommandParser((EvalArguments, DecodingConfig, PromptFormat), prog="trims eval",
                           description="Evaluate a student on a benchmark: accuracy and tokens per step.")
    args, config, prompt_format = parser.parse(argv)
    from ..evaluation import check_task_inputs
    from ..tasks import CodeExecutionDisabled, get_task

    try:
        task = get_task(args.task, style=args.mbpp_style) if args.task == "mbpp" else get_task(args.task)
        values = [float(v) for v in args.sweep.split(",")] if args.sweep else None
        check_task_inputs(task, args.data_file, args.allow_code_execution)
    except KeyError as error:
        return fail(f"--task {args.task}: {error.args[0]}")
    except (ValueError, FileNotFoundError, CodeExecutionDisabled) as error:
        return fail(str(error))
    return run(args, config, prompt_format, task, values)


def run(args: EvalArguments, config: DecodingConfig, prompt_format: PromptFormat, task, values: list[float] | None) -> int:
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer

    from ..evaluation import evaluate_task, format_table, plot_frontier, sweep
    from ..students import load_student
    from ..tasks import TaskDataError

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_student(args.model, **({} if args.dtype is None else {"dtype": args.dtype}))
    if args.adapter:
        model = PeftModel.from_pretrained(model, args.adapter)
    model = model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    name = args.model + (f" + {args.adapter}" if args.adapter else "")
    options = dict(limit=args.limit, data_file=args.data_file, execute_code=args.allow_code_execution,
                   batch_size=args.batch_size, progress=args.progress, model_name=name, prompt_format=prompt_format)
    try:
        if values is None:
            results = [evaluate_task(model, tokenizer, task, config, **options)]
        else:
            results = sweep(model, tokenizer, task, values, config, **options)
    except TaskDataError as error:
        return fail(str(error))
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
