"""MATH-500: minerva-style "Problem:" prompt, answer in ``\\boxed{}``, judged by math-verify."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

import math_verify

from .base import BOXED_INSTRUCTION, Example, Grade, Messages, Task, require
from .extraction import last_boxed

# Minerva's answer sentence, for completions that state the answer without a box.
_FINAL_ANSWER = re.compile(r"final answer is\s*\$?(.+?)\$?\s*(?:\.\s*I hope|\.?\s*$)", re.IGNORECASE | re.MULTILINE)
_TIMEOUT_S = 5


def _timeout() -> int | None:
    """math-verify's timeouts use SIGALRM, which works only in the main thread; elsewhere (e.g. a
    grading thread pool) it must run without one."""
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(answer: str) -> list[Any]:
    return math_verify.parse(f"\\boxed{{{answer}}}", parsing_timeout=_timeout())


class Math500Task(Task):
    name = "math500"
    hub_id = "HuggingFaceH4/MATH-500"

    def _to_example(self, row: Mapping[str, Any], index: int, source: str) -> Example:
        require(row, "problem", str, index, source)
        require(row, "answer", str, index, source)
        return Example(id=str(row.get("unique_id", index)), fields=dict(row))

    def messages(self, example: Example) -> Messages:
        return [{"role": "user", "content": f"Problem:\n{example.fields['problem']}\n\n{BOXED_INSTRUCTION}"}]

    def plain_text(self, messages: Messages) -> str:
        return super().plain_text(messages) + "\nSolution:"

    def prompt_format(self, tokenizer: Any = None) -> dict[str, Any]:
        return {
            "task": self.name,
            "template": self.template_name(tokenizer),
            "style": "minerva (Problem:/Solution:), zero-shot",
            "shots": 0,
            "boxed_instruction": BOXED_INSTRUCTION,
        }

    def reference(self, example: Example) -> str:
        return example.fields["answer"]

    def extract(self, completion_text: str) -> str | None:
        """The last ``\\boxed{}``/``\\fbox{}`` without a full stop that ends its sentence (math-verify reads ``3.``
        as no number), else minerva's "final answer is X"."""
        boxed = last_boxed(completion_text)
        if boxed is not None:
            stripped = boxed.rstrip()
            return stripped[:-1].rstrip() if stripped.endswith(".") and not stripped.endswith("..") else boxed
        stated = _FINAL_ANSWER.findall(completion_text)
        return stated[-1].strip() if stated else None

    def grade(self, example: Example, completion_text: str, execute_code: bool = False) -> Grade:
        return self.grade_answer(completion_text, example.fields["answer"])

    def grade_answer(self, completion_text: str, reference: str) -> Grade:
        """Grade against a bare reference answer (the dataset's ``answer`` column)."""
        extracted = self.extract(completion_text)
        if extracted is None:
            return Grade(correct=False, extracted=None, error="no \\boxed{} answer in the completion")
        gold, predicted = _parse(reference), _parse(extracted)
        if not predicted:
            return Grade(correct=False, extracted=extracted, error="math-verify could not parse the answer")
        correct = math_verify.verify(gold, predicted, timeout_seconds=_timeout())
        return Grade(correct=correct, extracted=extracted, error=None if correct else f"expected {reference}")
