"""Pulling the answer span out of free-form model output: ``\\boxed{...}`` and code blocks."""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\b")
_FENCE = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_BEGIN, _DONE = "[BEGIN]", "[DONE]"
_SPACES = re.compile(r"\s*")


def _closing_braces(text: str) -> dict[int, int]:
    """Where each unescaped ``{`` that closes is closed, in one pass (a degenerate completion of thousands of
    unclosed boxes costs no more than one of them)."""
    closing, opened = {}, []
    for i, character in enumerate(text):
        if character in "{}" and (i == 0 or text[i - 1] != "\\"):
            if character == "{":
                opened.append(i)
            elif opened:
                closing[opened.pop()] = i
    return closing


def last_boxed_span(text: str) -> tuple[int, int, str] | None:
    """Where the last complete ``\\boxed{...}`` / ``\\fbox{...}`` starts and ends in ``text``, and its content
    (:func:`last_boxed`)."""
    closing = None
    for match in reversed(list(_BOXED.finditer(text))):
        opening = _SPACES.match(text, match.end()).end()
        if text.startswith("{", opening):
            closing = _closing_braces(text) if closing is None else closing
            if opening in closing:
                content = text[opening + 1 : closing[opening]]
                return match.start(), closing[opening] + 1, content.strip()
        elif opening > match.end() and opening < len(text):
            stripped = text[opening:]
            line = stripped.split("\n", 1)[0]
            content = line.split("$", 1)[0] if "$" in line else re.split(r"[\s$]", stripped, maxsplit=1)[0]
            return match.start(), opening + len(content), content.strip()
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces kept).

    ``\\boxed 5`` (no braces) yields what runs to the closing ``$`` on its line (``$\\boxed 6 - 5i$``: ``6 - 5i``,
    as the Minerva / lm-eval grader reads it), else its first word. A box cut off by the generation length is
    skipped in favour of the previous complete one.
    """
    span = last_boxed_span(text)
    return None if span is None else span[2]


def code_block(text: str) -> str:
    """The program in a completion: the first ```python block, else the first ``` block, else the
    text between ``[BEGIN]`` and ``[DONE]``, else the whole text. An unclosed fence (generation
    cut off) runs to the end of the text."""
    blocks = _FENCE.findall(text)
    for language, body in blocks:
        if language.lower() in ("python", "py", "python3"):
            return body.rstrip()
    if blocks:
        return blocks[0][1].rstrip()
    begin = text.find(_BEGIN)
    start = begin + len(_BEGIN) if begin >= 0 else 0
    end = text.find(_DONE, start)
    return text[start : end if end >= 0 else len(text)].strip("\n").rstrip()
