"""The ``trims`` sub-commands, one module each, every one parsed from settings dataclasses.

A command module defines its argument dataclasses and ``main(argv) -> exit code``; it imports torch and
the library's heavy modules only inside ``main``, so ``trims <command> --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from ..errors import InputError, did_you_mean
from ..model_config import flag_name

INTERRUPTED = 130
"""The exit status of a command ended by Ctrl-C (the shell's 128 + SIGINT)."""

ALLOCATOR_SETTINGS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""The variables torch reads its caching allocator's settings from (the first is torch 2.9's name for the second)."""


def growable_cuda_segments() -> None:
    """Unless the user set the CUDA caching allocator up, let its segments grow (``expandable_segments:True``): the
    batch search's probes free the blocks of each batch that ran out of memory, which fixed-size segments keep as
    fragments the chosen batch may not fit in. Read when CUDA starts, so called before anything touches it."""
    if not any(os.environ.get(name) for name in ALLOCATOR_SETTINGS):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


class HelpFormatter(argparse.HelpFormatter):
    """A command's help as the docs write it: each flag in its dashed spelling (``--data_file`` still parses),
    on/off settings as bare flags, ``(required)`` on a required flag, and one default per flag: the value, unless
    the help text already says what happens without the flag (or the flag is off, or unset)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        shown = [option for option in action.option_strings if "_" not in option] or action.option_strings[:1]
        if action.nargs == 0:
            return ", ".join(shown)
        return ", ".join(f"{option} {self._format_args(action, self._get_default_metavar_for_optional(action))}"
                         for option in shown[:1]) + "".join(f", {option}" for option in shown[1:])

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required:
            return f"{text} (required)"
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


class _Renamed(argparse.Action):
    """The old spelling of a renamed flag: stores its value as the new flag does, with a one-line notice."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"note: {option_string} is now {self.new} (its value is used as given).", file=sys.stderr)
        setattr(namespace, self.dest, values)


class _Flags:
    """What :class:`CommandParser` hands ``HfArgumentParser``'s field parsing instead of itself: the same
    ``add_argument`` with the dashed spelling first (usage lines print the first), and a ``bool`` field as a flag
    (``--fast``; a field on by default as ``--progress`` / ``--no-progress``) instead of an option taking a value."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add_argument(self, *options: str, **kwargs: Any) -> Any:
        old = kwargs.pop("old_flags", ())
        if old:  # a renamed flag: the old spelling still works, unlisted, and says the new one
            action = self.add_argument(*options, **kwargs)
            self.parser.add_argument(*old, dest=action.dest, type=kwargs.get("type"), action=_Renamed,
                                     help=argparse.SUPPRESS, new=action.option_strings[0])
            return action
        dashed = tuple(option for option in options if "_" not in option)
        underscored = tuple(option for option in options if "_" in option)
        if kwargs.get("type") is string_to_bool and kwargs.get("nargs") == "?":
            for key in ("type", "nargs", "const"):
                kwargs.pop(key)
            if kwargs.get("default") is not True:
                return self.parser.add_argument(*dashed, *underscored, action="store_true", **kwargs)
            action = self.parser.add_argument(*dashed, action=argparse.BooleanOptionalAction, **kwargs)
            if underscored:  # the underscore spelling still parses, unlisted
                self.parser.add_argument(*underscored, action="store_true", dest=action.dest, default=True,
                                         help=argparse.SUPPRESS)
            return action
        if kwargs.get("action") == "store_false":  # HF's --no_x complement: BooleanOptionalAction made --no-x
            taken = self.parser._option_string_actions
            underscored = tuple(option for option in options if option not in taken)
            return self.parser.add_argument(*underscored, **{**kwargs, "help": argparse.SUPPRESS}) if underscored else None
        return self.parser.add_argument(*dashed, *underscored, **kwargs)


class CommandParser(HfArgumentParser):
    """``HfArgumentParser`` for a ``trims`` command: both ``--a-b`` and ``--a_b`` spellings (help and usage show
    the dashed one), on/off settings as flags, no abbreviations, and a user mistake is one ``error:`` line (exit
    code 2) instead of the whole usage."""

    def __init__(self, dataclass_types, prog: str, description: str | None = None) -> None:
        super().__init__(dataclass_types, prog=prog, description=description, allow_abbrev=False,
                         formatter_class=HelpFormatter)

    @staticmethod
    def _parse_dataclass_field(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        HfArgumentParser._parse_dataclass_field(_Flags(parser), field)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")

    def parse(self, argv: list[str]) -> tuple:
        """Parse ``argv`` into one instance per dataclass; an unknown flag, or a value a dataclass rejects, is an
        ``error:`` line too, in the flags' terms."""
        parsed, rest = self.parse_known(argv)
        if rest:
            flag = rest[0].split("=")[0]
            if flag.startswith("-"):
                options = (option for action in self._actions for option in action.option_strings)
                self.error(f"unknown flag {flag}{did_you_mean(flag, options)}")
            self.error(f"unexpected argument {flag!r}")
        return parsed

    def parse_known(self, argv: list[str]) -> tuple[tuple, list[str]]:
        """As :meth:`parse`, for a command that passes on what it does not know (``trims train``'s recipe
        overrides): the instances, and the strings left over in their order."""
        try:
            *parsed, rest = self.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
        except ValueError as error:
            self.error(self.in_flag_terms(str(error)))
        return tuple(parsed), rest

    def given(self, argv: Iterable[str]) -> set[str]:
        """The settings (field names) ``argv`` sets by a flag: what the user chose, as opposed to the defaults, so that
        a command can refuse a flag that does nothing with the others given without refusing a default."""
        names = set()
        for arg in argv:
            if arg == "--":
                break
            if (action := self._option_string_actions.get(arg.split("=", 1)[0])) is not None:
                names.add(action.dest)
        return names

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


def check_push_flags(push_to_hub: str | None, **push_only: Any) -> None:
    """The flags only ``--push-to-hub`` reads (``push_only``: name -> value, unset as None or False), refused without
    it: the user believes they changed what was written."""
    given = [flag_name(name) for name, value in push_only.items() if value not in (None, False)]
    if given and not push_to_hub:
        them = "them" if len(given) > 1 else "it"
        raise InputError(f"{', '.join(given)}: only --push-to-hub reads {them}; drop {them}, or pass --push-to-hub "
                         "REPO.")
