"""MBPP (full config): instruct prompt with the test asserts, or the classic 3-shot [BEGIN]/[DONE] (lm-eval's ``mbpp``)."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any, Literal

from .base import CodeTask, Example, Messages, TaskDataError, require
from .sandbox import SandboxLimits

Style = Literal["instruct", "3shot"]

# task_id ranges of the official splits; a local copy of mbpp.jsonl holds all 974 tasks.
SPLIT_IDS = {"prompt": range(1, 11), "test": range(11, 511), "validation": range(511, 601), "train": range(601, 975)}
SHOT_IDS = (2, 3, 4)
INSTRUCTION = "Write the function in a ```python code block."


def _task_text(example: Example) -> str:
    tests = "\n".join(example.fields["test_list"])
    return (
        f"You are an expert Python programmer, and here is your task: {example.fields['text']} "
        f"Your code should pass these tests:\n\n{tests}\n"
    )


SHOT_DELIMITER = "\n\n"
"""Between the shots, and before the task, in the 3-shot plain text (lm-eval's ``fewshot_delimiter``)."""


class MBPPTask(CodeTask):
    name = "mbpp"
    hub_id = "google-research-datasets/mbpp"
    hub_config = "full"

    def __init__(self, style: Style = "instruct", limits: SandboxLimits | None = None) -> None:
        if style not in ("instruct", "3shot"):
            raise ValueError(f"mbpp style must be 'instruct' or '3shot', not {style!r}")
        super().__init__(limits)
        self.style = style
        self.stop_strings = ("[DONE]",) if style == "3shot" else ()
        self.shots: list[Example] = []

    def load(self, data_file: str | None = None, limit: int | None = None, split: str | None = None) -> list[Example]:
        """Examples of ``split`` (test = task_ids 11-510); in 3-shot style also the shots 2, 3, 4."""
        if self.style == "3shot":
            prompt_split = {int(e.id): e for e in super().load(data_file, None, "prompt")}
            self.shots = [prompt_split[i] for i in SHOT_IDS]
        return super().load(data_file, limit, split)

    def _select(self, examples: list[Example], split: str) -> list[Example]:
        if split not in SPLIT_IDS:
            raise ValueError(f"mbpp split must be one of {sorted(SPLIT_IDS)}, not {split!r}")
        return [e for e in examples if int(e.id) in SPLIT_IDS[split]]

    def _to_example(self, row: Mapping[str, Any], index: int, source: str) -> Example:
        require(row, "text", str, index, source)
        require(row, "code", str, index, source)
        tests = require(row, "test_list", list, index, source)
        if not tests or not all(isinstance(t, str) for t in tests):
            raise TaskDataError(f"{source}: row {index} field 'test_list' must be a non-empty list of strings")
        task_id = require(row, "task_id", int, index, source)
        return Example(id=str(task_id), fields=dict(row))

    def messages(self, example: Example) -> Messages:
        if self.style == "instruct":
            return [{"role": "user", "content": f"{_task_text(example)}\n{INSTRUCTION}"}]
        if not self.shots:
            raise RuntimeError("mbpp 3-shot prompts need the shot examples: call load() first")
        messages: Messages = []
        for shot in self.shots:
            messages.append({"role": "user", "content": f"{_task_text(shot)}[BEGIN]\n"})
            messages.append({"role": "assistant", "content": f"{shot.fields['code']}\n[DONE]"})
        messages.append({"role": "user", "content": f"{_task_text(example)}[BEGIN]\n"})
        return messages

    def plain_text(self, messages: Messages) -> str:
        """The classic continuation format, as lm-evaluation-harness's ``mbpp`` task writes it: each shot's task
        and answer, the shots and the task apart by a blank line, ending with ``[BEGIN]``."""
        if self.style == "instruct":
            return super().plain_text(messages)
        turns = [m["content"] for m in messages]
        shots = [task + answer for task, answer in zip(turns[:-1:2], turns[1::2])]
        return SHOT_DELIMITER.join([*shots, turns[-1]])

    def prompt_format(self, tokenizer: Any = None) -> dict[str, Any]:
        return {
            "task": self.name,
            "template": self.template_name(tokenizer),
            "style": self.style,
            "shots": len(SHOT_IDS) if self.style == "3shot" else 0,
            "shot_task_ids": list(SHOT_IDS) if self.style == "3shot" else [],
            "instruction": INSTRUCTION if self.style == "instruct" else "[BEGIN]...[DONE]",
        }

    def reference(self, example: Example) -> str:
        """The data set's reference program (the verdict itself comes from ``test_list``)."""
        return example.fields["code"]

    def solution_and_tests(self, example: Example, completion_text: str) -> tuple[str, str]:
        """The solution followed by ``test_setup_code`` (it builds objects from the solution's
        classes, so it runs on the solution's side); the asserts run in the judge."""
        fields = example.fields
        solution = f"{self.extract(completion_text)}\n\n{fields.get('test_setup_code') or ''}\n"
        return solution, "\n".join(fields["test_list"]) + "\n"

    def entry_points(self, example: Example) -> tuple[str, ...]:
        """Functions the reference solution defines and the asserts call (e.g. task 126's ``sum``)."""
        defined = {node.name for node in ast.parse(example.fields["code"]).body if isinstance(node, ast.FunctionDef)}
        called = {node.func.id for test in example.fields["test_list"] for node in ast.walk(ast.parse(test))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        return tuple(sorted(defined & called))
