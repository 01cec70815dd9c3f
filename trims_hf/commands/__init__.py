"""The ``trims`` sub-commands, one module each, every one parsed from settings dataclasses.

A command module defines its argument dataclasses and ``main(argv) -> exit code``; it imports torch and
the library's heavy modules only inside ``main``, so ``trims <command> --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterable
from typing import NoReturn

from transformers import HfArgumentParser

from ..errors import did_you_mean
from ..model_config import flag_name


class CommandParser(HfArgumentParser):
    """``HfArgumentParser`` for a ``trims`` command: both ``--a_b`` and ``--a-b`` spellings, no abbreviations,
    and a user mistake is one ``error:`` line (exit code 2) instead of the whole usage."""

    def __init__(self, dataclass_types, prog: str, description: str | None = None) -> None:
        super().__init__(dataclass_types, prog=prog, description=description, allow_abbrev=False)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")

    def parse(self, argv: list[str]) -> tuple:
        """Parse ``argv`` into one instance per dataclass; an unknown flag, or a value a dataclass rejects, is an
        ``error:`` line too, in the flags' terms."""
        try:
            *parsed, rest = self.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
        except ValueError as error:
            self.error(self.in_flag_terms(str(error)))
        if rest:
            flag = rest[0].split("=")[0]
            if flag.startswith("-"):
                options = (option for action in self._actions for option in action.option_strings)
                self.error(f"unknown flag {flag}{did_you_mean(flag, options)}")
            self.error(f"unexpected argument {flag!r}")
        return tuple(parsed)

    def in_flag_terms(self, message: str) -> str:
        """A library message as the command-line user reads it: the parsed settings named by their flags."""
        return flag_terms(message, (f.name for cls in self.dataclass_types for f in dataclasses.fields(cls)))


def flag_terms(message: str, names: Iterable[str]) -> str:
    """Say ``max_length``, ``truncate=True`` and ``metric='x'`` as the flags typed: ``--max-length``, ``--truncate``,
    ``--metric 'x'``. Bare names are rewritten only when they hold an underscore, so plain words stay words."""
    for name in sorted(set(names), key=len, reverse=True):
        flag, before = flag_name(name), r"(?<![\w'\-])"
        message = re.sub(rf"{before}{name}=True\b", flag, message)
        message = re.sub(rf"{before}{name}=", f"{flag} ", message)
        if "_" in name:
            message = re.sub(rf"{before}{name}\b(?!')", flag, message)
    return message


def fail(message: str, code: int = 2) -> int:
    """Report a user mistake (or why a run stopped) in one line and return the exit code (usage error: 2)."""
    print(f"error: {message}", file=sys.stderr)
    return code
