"""GSM8K: zero-shot chain of thought, final answer in ``\\boxed{}``, graded numerically."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

from .base import BOXED_INSTRUCTION, Example, Grade, Messages, Task, TaskDataError, require
from .extraction import last_boxed

# A number, optionally negative, with optional thousands separators and decimals ("-1,234.50").
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])-?\.\d+")
_FRACTION = re.compile(r"(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}|(-?\d+)\s*/\s*(\d+)")
_UNITS = re.compile(r"\\(?:text|mbox|mathrm)\{[^{}]*\}")
_NOISE = re.compile(r"\\[$%!,;]|[$%]|\{,\}|\\left|\\right")
_HASHES = re.compile(r"####\s*(.*)")


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    decimal = Decimal(value.numerator) / Decimal(value.denominator)
    return format(decimal.normalize(), "f") if Fraction(decimal) == value else str(value)


def parse_number(text: str) -> str | None:
    """The number a short answer states, normalised ("$1,234.00" -> "1234"); None if there is none.

    Currency signs, percent signs, thousands separators and ``\\text{...}`` units are dropped; a
    lone fraction (``\\frac{1}{2}``, ``3/4``) is kept exact; otherwise the last number counts.
    """
    cleaned = _NOISE.sub("", _UNITS.sub(" ", text)).strip().rstrip(".")
    fraction = _FRACTION.fullmatch(cleaned)
    if fraction:
        sign, num, den = (fraction[1], fraction[2], fraction[3]) if fraction[2] else ("", fraction[4], fraction[5])
        if int(den) != 0:
            return _format(Fraction(int(num), int(den)) * (-1 if sign else 1))
    numbers = _NUMBER.findall(cleaned)
    return _format(Fraction(numbers[-1].replace(",", ""))) if numbers else None


class GSM8KTask(Task):
    name = "gsm8k"
    hub_id = "openai/gsm8k"
    hub_config = "main"

    def _to_example(self, row: Mapping[str, Any], index: int, source: str) -> Example:
        require(row, "question", str, index, source)
        answer = require(row, "answer", str, index, source)
        if "####" not in answer or parse_number(answer.rsplit("####", 1)[1]) is None:
            raise TaskDataError(f"{source}: row {index} field 'answer' has no '#### <number>' line")
        return Example(id=str(index), fields=dict(row))

    def reference(self, example: Example) -> str:
        """The gold number, normalised like extracted answers."""
        return parse_number(example.fields["answer"].rsplit("####", 1)[1])

    def messages(self, example: Example) -> Messages:
        return [{"role": "user", "content": f"{example.fields['question']}\n{BOXED_INSTRUCTION}"}]

    def prompt_format(self, tokenizer: Any = None) -> dict[str, Any]:
        return {
            "task": self.name,
            "template": self.template_name(tokenizer),
            "style": "zero-shot chain of thought",
            "shots": 0,
            "boxed_instruction": BOXED_INSTRUCTION,
        }

    def extract(self, completion_text: str) -> str | None:
        """Last ``\\boxed{}``, else the last ``#### X``, else the last number in the text."""
        boxed = last_boxed(completion_text)
        if boxed is not None and (number := parse_number(boxed)) is not None:
            return number
        hashes = _HASHES.findall(completion_text)
        if hashes and (number := parse_number(hashes[-1])) is not None:
            return number
        return parse_number(completion_text)

    def grade(self, example: Example, completion_text: str, execute_code: bool = False) -> Grade:
        return self._judge(completion_text, self.reference(example))

    def grade_answer(self, completion_text: str, reference: str) -> Grade:
        """Grade against a bare reference: a number or a full GSM8K solution ending in ``#### X``."""
        gold = parse_number(reference.rsplit("####", 1)[-1])
        if gold is None:
            raise TaskDataError(f"gsm8k reference {reference!r} holds no number")
        return self._judge(completion_text, gold)

    def _judge(self, completion_text: str, gold: str) -> Grade:
        """Compare the extracted number with ``gold`` exactly (as fractions: "18.0" == "18")."""
        extracted = self.extract(completion_text)
        if extracted is None:
            return Grade(correct=False, extracted=None, error="no number found in the completion")
        correct = Fraction(extracted) == Fraction(gold)
        return Grade(correct=correct, extracted=extracted, error=None if correct else f"expected {gold}")
