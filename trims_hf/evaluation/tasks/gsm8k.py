"""GSM8K: zero-shot chain of thought, final answer in ``\\boxed{}``, graded numerically."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

from .base import BOXED_INSTRUCTION, Example, Grade, Messages, Task, TaskDataError, require
from .extraction import last_boxed_span

# A number, optionally negative, with optional thousands separators and decimals ("-1,234.50").
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])-?\.\d+")
# \frac{1}{2}, its shorthand \frac12, or 1/2
_FRAC = r"\\[dt]?frac(?:\{(?P<num>-?\d+)\}\{(?P<den>-?\d+)\}|(?P<digit>\d)(?P<under>\d))"
_FRACTION = re.compile(rf"(?P<sign>-?){_FRAC}|(?<![\w.])(?P<over>-?\d+)\s*/\s*(?P<below>\d+)")
_UNITS = re.compile(r"\\(?:text|mbox|mathrm)\{([^{}]*)\}")
_DIGIT = re.compile(r"\d")
_NOISE = re.compile(r"\\[$%!,;]|[$%]|\{,\}|\\left|\\right")
_HASHES = re.compile(r"####\s*(.*)")
_MINUS = str.maketrans({"\u2212": "-"})  # the minus sign of math fonts and some tokenizers
# ft^2, \text{m}^{3}: a unit's power, not a number's (group 1, the unit, is kept)
_UNIT_POWER = re.compile(r"([A-Za-z]|\\(?:text|mbox|mathrm)\{[^{}]*\})\s*\^\s*(?:\{[^{}]*\}|\d+)")
_NO_NUMBER = "\x00"  # what a power that cannot be written out leaves, so a power over it cannot be either
_EXPONENT = r"(?:\{\s*(?:[-+]?\d+(?:\.\d+)?|\x00)\s*\}|[-+]?\d+(?:\.\d+)?)"
# A power or a tower of them (2^3^2), with an optional factor before it ("3 \times 10^{6}") and a base that may be a
# bracketed negative number ("(-2)^3"). It starts only where a number does, so a long run of digits costs one pass.
_POWER = re.compile(r"(?<![\d.])(?:(?P<factor>\d+(?:\.\d+)?)\s*(?:\\times|\\cdot|\u00d7)\s*)?"
                    r"(?:\(\s*(?P<bracketed>[-+]?(?:\d+(?:\.\d+)?|\.\d+))\s*\)|(?P<base>\d+(?:\.\d+)?|\.\d+))"
                    rf"(?P<exponents>(?:\s*\^\s*{_EXPONENT})+)")
_MAX_NESTING = 8  # powers inside exponents read, one level a pass: 2^{3^{2}} takes two
_MAX_DIGITS = 300  # a power written out past this many digits states no answer (and Python prints ints to 4,300)
_MIXED = re.compile(rf"(?P<sign>-?)(?<![\d.])(?P<whole>\d+)\s*{_FRAC}")  # from a digit run's start: one pass
_LEADING = re.compile(r"\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)")  # a text's first number: \text{18 cups}
_SPACED = re.compile(r"-?\d{1,3}(?: \d{3})+")  # "1 000 000", thousands apart by spaces


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    decimal = Decimal(value.numerator) / Decimal(value.denominator)
    return format(decimal.normalize(), "f") if Fraction(decimal) == value else str(value)


def _power(match: re.Match[str]) -> str:
    """One power or tower (times its factor) written out, a tower from the top down as mathematics reads it
    (``2^3^2`` = 2^9); :data:`_NO_NUMBER` where a power is undefined (``0^{-1}``), a tower's exponent is not a
    whole number, or the number would be longer than :data:`_MAX_DIGITS`."""
    if _NO_NUMBER in match["exponents"]:
        return _NO_NUMBER
    *lower, exponent = (Fraction(e) for e in re.findall(r"[-+]?\d+(?:\.\d+)?", match["exponents"]))
    for below in reversed(lower):
        exponent = _whole_power(below, exponent)
    value = _whole_power(Fraction(match["bracketed"] or match["base"]), exponent)
    return _NO_NUMBER if value is None else _format(Fraction(match["factor"] or 1) * value)


def _whole_power(base: Fraction, exponent: Fraction | None) -> Fraction | None:
    """``base ** exponent``; None where the exponent is none or not whole, or the power is undefined or longer than
    :data:`_MAX_DIGITS` digits."""
    if exponent is None or exponent.denominator != 1:
        return None
    digits = max(len(str(abs(base.numerator))), len(str(base.denominator)))  # 1.5 is 3/2
    if (base == 0 and exponent < 0) or abs(exponent) * digits > _MAX_DIGITS:
        return None
    return base ** int(exponent)


def _exact(number: str) -> Fraction | None:
    """The value of a number as written; None past the digits Python reads into an int (4,300)."""
    try:
        return Fraction(number)
    except ValueError:
        return None


def parse_number(text: str) -> str | None:
    """The number a short answer states, normalised ("$1,234.00" -> "1234"); None if there is none, or if it has
    more digits than Python reads into an int (4,300), which a looping model can write.

    Currency signs, percent signs, thousands separators (commas, LaTeX spaces, or plain spaces in a lone number),
    ``\\text{...}`` units and their powers are dropped (a number that starts a text, ``\\text{18 cups}``, is read
    when nothing else states one); the minus sign (U+2212) reads as "-"; powers (``10^6``, ``3 \\times 10^{6}``) are
    written out, one undefined or past :data:`_MAX_DIGITS` digits being no number; a fraction (``\\frac{1}{2}``,
    ``\\frac12``, ``3/4``) or mixed number (``1\\frac{1}{2}``) with no other digit beside it is kept exact, words
    around it aside, and one over zero states no number; otherwise the last number counts.
    """
    try:
        return _parse_number(text)
    except ValueError:  # int() / Fraction() of a number past 4,300 digits
        return None


def _parse_number(text: str) -> str | None:
    text = _UNIT_POWER.sub(r"\1", text.translate(_MINUS))
    number = _read(_UNITS.sub(" ", text))
    if number is None and _UNITS.search(text):  # the number itself set as text: \text{18 cups}, \mathrm{18}
        number = _read(_UNITS.sub(lambda unit: f" {leading[1]} " if (leading := _LEADING.match(unit[1])) else " ", text))
    return number


def _fraction(match: re.Match[str], whole: int = 0) -> str | None:
    """The exact value of a fraction match (``\\frac{a}{b}``, ``\\frac12``, ``a/b``) plus ``whole``; None over zero."""
    num, den = ((match["num"], match["den"]) if match["num"] else (match["digit"], match["under"]) if match["digit"]
                else (match["over"], match["below"]))
    if int(den) == 0:
        return None
    return _format((whole + Fraction(int(num), int(den))) * (-1 if match["sign"] else 1))


def _alone(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The one match of ``pattern`` in ``text`` when no other digit is written beside it ("\\frac{10}{2} dollars")."""
    matches = list(pattern.finditer(text))
    if len(matches) != 1:
        return None
    match = matches[0]
    return None if _DIGIT.search(text[: match.start()] + " " + text[match.end() :]) else match


def _read(cleaned: str) -> str | None:
    """The number of a text whose units are gone: powers written out, a lone fraction or mixed number exact, else
    the last number."""
    cleaned = _NOISE.sub("", cleaned)
    for _ in range(_MAX_NESTING):  # a power in an exponent first: 2^{3^{2}}
        if (powered := _POWER.sub(_power, cleaned)) == cleaned:
            break
        cleaned = powered
    cleaned = cleaned.replace(_NO_NUMBER, " ").strip().rstrip(".")
    if fraction := _alone(_FRACTION, cleaned):
        return _fraction(fraction)
    if mixed := _alone(_MIXED, cleaned):
        return _fraction(mixed, int(mixed["whole"]))
    numbers = [cleaned.replace(" ", "")] if _SPACED.fullmatch(cleaned) else _NUMBER.findall(cleaned)
    value = _exact(numbers[-1].replace(",", "")) if numbers else None
    return None if value is None else _format(value)


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
        """Last ``\\boxed{}``, else the last ``#### X``, else the last number in the text outside that box (a box
        stating no number, such as ``\\boxed{3/0}``, is not read for a fragment of one)."""
        if (boxed := last_boxed_span(completion_text)) is not None:
            if (number := parse_number(boxed[2])) is not None:
                return number
            completion_text = completion_text[: boxed[0]] + " " + completion_text[boxed[1] :]
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
