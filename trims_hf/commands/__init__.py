"""The ``trims`` sub-commands, one module each, every one parsed from settings dataclasses.

A command module defines its argument dataclasses and ``main(argv) -> exit code``; it imports torch and
the library's heavy modules only inside ``main``, so ``trims <command> --help`` stays fast.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable
from typing import NoReturn

from transformers import HfArgumentParser


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the candidates ``word`` starts (``--model``), else its closest spelling; or ``""``."""
    candidates = sorted(set(candidates))
    close = [c for c in candidates if c.startswith(word)][:3] or difflib.get_close_matches(word, candidates, n=1)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


class CommandParser(HfArgumentParser):
    """``HfArgumentParser`` for a ``trims`` command: both ``--a_b`` and ``--a-b`` spellings, no abbreviations,
    and a user mistake is one ``error:`` line (exit code 2) instead of the whole usage."""

    def __init__(self, dataclass_types, prog: str, description: str | None = None) -> None:
        super().__init__(dataclass_types, prog=prog, description=description, allow_abbrev=False)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")

    def parse(self, argv: list[str]) -> tuple:
        """Parse ``argv`` into one instance per dataclass; an unknown flag or a value a dataclass rejects is an
        ``error:`` line too."""
        try:
            *parsed, rest = self.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
        except ValueError as error:
            self.error(str(error))
        if rest:
            flag = rest[0].split("=")[0]
            if flag.startswith("-"):
                options = (option for action in self._actions for option in action.option_strings)
                self.error(f"unknown flag {flag}{did_you_mean(flag, options)}")
            self.error(f"unexpected argument {flag!r}")
        return tuple(parsed)


def fail(message: str) -> int:
    """Report a user mistake in one line and return the usage-error exit code."""
    print(f"error: {message}", file=sys.stderr)
    return 2
