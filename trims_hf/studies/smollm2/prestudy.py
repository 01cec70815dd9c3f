"""The pre-study: a pretrained model's zero-shot greedy accuracy as an autoregressive model on the word problems per
difficulty level and on GSM8K, to show which levels it has any grip on before a GPU study spends its budget (never
what a study selects its level on: that is the MDLM-adapted base's). Prompts, answer extraction and grading are the
tasks' own; decoding is transformers' greedy ``generate`` with a KV cache. Importing it loads torch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ...evaluation.evaluate import load_examples
from ...evaluation.tasks import Example, Task, get_task
from ...generation import cut_at_stop_strings
from ...settings import PromptFormat
from ..arith import ArithTask, make_splits


def greedy_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task, examples: Sequence[Example],
                    max_new_tokens: int, batch_size: int) -> dict[str, float | int]:
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


def problem_sets(levels: Sequence[int], per_level: int, seed: int, gsm8k: Path) -> list[tuple[str, Task, list[Example]]]:
    """(name, task, examples) of the pre-study: ``per_level`` word problems of each level (drawn with ``seed`` plus
    the level, not the study's data seeds), then the first ``per_level`` GSM8K test problems of the file ``gsm8k``."""
    sets: list[tuple[str, Task, list[Example]]] = []
    for level in levels:
        task = ArithTask(make_splits(0, per_level, seed + level, level)[1], name=f"arith-L{level}")
        sets.append((task.name, task, task.load()))
    task = get_task("gsm8k")
    return [*sets, ("gsm8k", task, load_examples(task, str(gsm8k), per_level))]
