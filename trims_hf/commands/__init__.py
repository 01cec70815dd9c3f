"""The ``trims`` sub-commands, one module each, every one parsed from settings dataclasses.

A command module defines its argument dataclasses and ``main(argv) -> exit code``; it imports torch and
the library's heavy modules only inside ``main``, so ``trims <command> --help`` stays fast.
"""

from __future__ import annotations

import re
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
        """Parse ``argv`` into one instance per dataclass; a value a dataclass rejects is an ``error:`` line too,
        in the flags' terms."""
        try:
            return self.parse_args_into_dataclasses(args=argv)
        except ValueError as error:
            self.error(self.in_flag_terms(str(error)))

    def in_flag_terms(self, message: str) -> str:
        """A settings message as the user typed it: ``gen_length=30`` -> ``--gen-length 30``, ``prompt_format`` ->
        ``--prompt-format`` (bare one-word names such as ``threshold`` stay prose)."""
        names = sorted({a.dest for a in self._actions if a.dest != "help"}, key=len, reverse=True)
        pattern = re.compile(rf"(?<![\w-])({'|'.join(map(re.escape, names))})(?:=(\S+?))?(?=[\s,.;:)]|$)")

        def flag(match: re.Match) -> str:
            name, value = match[1], match[2]
            if value is None and "_" not in name:
                return match[0]
            return f"--{name.replace('_', '-')}" + (f" {value}" if value is not None else "")

        return pattern.sub(flag, message)


def fail(message: str, code: int = 2) -> int:
    """Report a user mistake (or why a run stopped) in one line and return the exit code (usage error: 2)."""
    print(f"error: {message}", file=sys.stderr)
    return code
