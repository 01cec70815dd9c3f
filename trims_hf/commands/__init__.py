"""The ``trims`` sub-commands, one module each, every one parsed from settings dataclasses.

A command module defines its argument dataclasses and ``main(argv) -> exit code``; it imports torch and
the library's heavy modules only inside ``main``, so ``trims <command> --help`` stays fast.
"""

from __future__ import annotations

import sys
from typing import NoReturn

from transformers import HfArgumentParser


class CommandParser(HfArgumentParser):
    """``HfArgumentParser`` for a ``trims`` command: both ``--a_b`` and ``--a-b`` spellings, no abbreviations,
    and a user mistake is one ``error:`` line (exit code 2) instead of the whole usage."""

    def __init__(self, dataclass_types, prog: str, description: str | None = None) -> None:
        super().__init__(dataclass_types, prog=prog, description=description, allow_abbrev=False)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")

    def parse(self, argv: list[str]) -> tuple:
        """Parse ``argv`` into one instance per dataclass; a value a dataclass rejects is an ``error:`` line too."""
        try:
            return self.parse_args_into_dataclasses(args=argv)
        except ValueError as error:
            self.error(str(error))


def fail(message: str) -> int:
    """Report a user mistake in one line and return the usage-error exit code."""
    print(f"error: {message}", file=sys.stderr)
    return 2
