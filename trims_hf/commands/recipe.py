"""``trims train``'s recipe: one flat YAML mapping whose keys are the fields of the job's argument dataclasses
(:class:`~trims_hf.training.train_job.ModelArguments`, :class:`~trims_hf.training.train_job.DataArguments`,
:class:`~trims_hf.MDLMConfig`: every ``TrainingArguments`` field plus the TRIMS settings), read and checked with
``--key value`` overrides into those dataclasses. Unknown keys are errors, so a typo never silently trains with a
default.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from transformers import HfArgumentParser

from ..errors import InputError, did_you_mean, one_line
from ..training.config import MDLMConfig
from ..training.train_job import DataArguments, ModelArguments

RECIPE_TYPES = (ModelArguments, DataArguments, MDLMConfig)


def recipe_keys() -> set[str]:
    return {f.name for dtype in RECIPE_TYPES for f in dataclasses.fields(dtype) if f.init}


def _did_you_mean(key: str, prefix: str = "") -> str:
    """Recipe keys close to ``key`` (``prefix`` "--" for an override), spelled with underscores."""
    return did_you_mean(prefix + key.split("=")[0].lstrip("-").replace("-", "_"), (prefix + k for k in recipe_keys()))


class _RepeatedKey(yaml.YAMLError):
    def __init__(self, key: str, first: int, again: int) -> None:
        super().__init__(f"key {key!r} is set twice (lines {first} and {again}); keep one.")


class _RecipeLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key set twice in one mapping: PyYAML would keep the last one silently, and a
    recipe edited by appending a line would then train with a value its reader may not see."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[str, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                line = key_node.start_mark.line + 1
                if key_node.value in lines:
                    raise _RepeatedKey(key_node.value, lines[key_node.value], line)
                lines[key_node.value] = line
        return super().construct_mapping(node, deep=deep)


def read_recipe(path: str | Path) -> dict[str, Any]:
    """The YAML mapping of a recipe, with every key checked against the known fields."""
    try:
        recipe = yaml.load(Path(path).read_text(), Loader=_RecipeLoader) or {}
    except FileNotFoundError:
        raise InputError(f"--config {path}: no such file.") from None
    except _RepeatedKey as error:
        raise InputError(f"--config {path}: {error}") from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        raise InputError(f"--config {path}: not valid YAML ({error.problem} at line {mark.line + 1}, "
                          f"column {mark.column + 1}).") from None
    except (OSError, yaml.YAMLError) as error:
        raise InputError(f"--config {path}: cannot read the recipe ({one_line(error)}).") from None
    if not isinstance(recipe, dict):
        raise InputError(f"--config {path}: a recipe is a YAML mapping of key: value lines, got {type(recipe).__name__}.")
    unknown = sorted(map(str, set(recipe) - recipe_keys()))
    if unknown:
        named = ", ".join(f"{key!r}{_did_you_mean(key)}" for key in unknown)
        raise InputError(f"{path}: unknown key(s) {named}; `trims train --help-keys` lists them.")
    return recipe


class _RecipeParser(HfArgumentParser):
    """``HfArgumentParser`` whose usage errors raise (for one ``error:`` line) instead of printing the whole usage."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(RECIPE_TYPES, prog=f"trims train --config {path}", allow_abbrev=False, exit_on_error=False)

    def error(self, message: str) -> NoReturn:
        raise InputError(message)

    def actions(self) -> dict[str, argparse.Action]:
        """Each key's first action (a boolean's ``--no_<key>`` comes after it)."""
        actions: dict[str, argparse.Action] = {}
        for action in self._actions:
            actions.setdefault(action.dest, action)
        return actions

    def typed(self, action: argparse.Action, hint: Any, value: Any) -> Any:
        """A recipe value typed and checked as the same value given on the command line would be (so ``1e-4``, which
        YAML reads as text, is the number it is there too); raises ``ValueError`` naming what was expected."""
        if value is None:
            if type(None) not in typing.get_args(hint):
                raise ValueError(f"null is not allowed; expected {_expected(action)}.")
            return None
        if isinstance(value, dict) and dict in typing.get_args(hint):
            return value
        listed = action.nargs in ("+", "*")
        if isinstance(value, list) and not listed:
            raise ValueError(f"expected one {_expected(action)}, got the list {value}.")
        items = value if isinstance(value, list) else [value]
        nested = next((item for item in items if isinstance(item, (dict, list))), None)
        if nested is not None:  # never the text of a mapping or list as one value ("{'a': 1}")
            raise ValueError(f"expected {'a list of ' if listed else 'one '}{_expected(action)}, got {nested}.")
        words = [_scalar(item) for item in items]
        try:
            return self._get_values(action, words)
        except argparse.ArgumentError as error:
            raise ValueError(error.message) from None


def _scalar(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _expected(action: argparse.Action) -> str:
    if action.choices:
        return "one of " + ", ".join(map(str, action.choices))
    kind = getattr(action.type, "__name__", "value")
    return "true or false" if kind == "string_to_bool" else kind


NULLS = ("null", "Null", "NULL", "~")
"""YAML's spellings of null."""


def _override_key(token: str) -> str | None:
    """The recipe key a ``--key`` or ``--key=value`` token names (dashes or underscores), None for a value."""
    return token.partition("=")[0].removeprefix("--").replace("-", "_") if token.startswith("--") else None


def override_keys(overrides: Sequence[str]) -> set[str]:
    """The recipe keys the command line gives (``--key value``, ``--key=value``, dashes or underscores)."""
    return {key for token in overrides if (key := _override_key(token)) is not None}


def unset_nulls(overrides: Sequence[str], hints: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """``overrides`` without each ``--key null`` (YAML's spellings) of a key that may be unset and holds no text (a
    text key keeps "null" as its value), which sets ``defaults[key]`` to None instead and drops the key's earlier
    values: the last one given wins, as argparse has it."""
    kept: list[list[str]] = []
    for item in _flag_items(overrides):
        key = _override_key(item[0])
        value = item[0].partition("=")[2] if "=" in item[0] else (item[1] if len(item) > 1 else None)
        kinds = typing.get_args(hints.get(key))
        if key is not None and value in NULLS and type(None) in kinds and str not in kinds:
            defaults[key] = None
            kept = [other for other in kept if _override_key(other[0]) != key]
        else:
            kept.append(item)
    return [token for item in kept for token in item]


def _flag_items(tokens: Sequence[str]) -> list[list[str]]:
    """``tokens`` grouped as given: ``[--key=value]``, ``[--key, value]``, a bare ``[--flag]`` or a stray value."""
    items: list[list[str]] = []
    for token in tokens:
        previous = items[-1] if items else None
        if previous and not token.startswith("--") and len(previous) == 1 and previous[0].startswith("--") \
                and "=" not in previous[0]:
            previous.append(token)
        else:
            items.append([token])
    return items


def parse_recipe(path: str | Path, overrides: Sequence[str] = ()) -> tuple[ModelArguments, DataArguments, MDLMConfig]:
    """Parse a recipe plus ``--key value`` overrides into the three argument dataclasses; ``--key null`` unsets a key
    whose value may be unset (``global_batch_size``), as ``key: null`` in the recipe does.

    As TRL's ``TrlParser``, the recipe's values become the parser's defaults and the command line overrides them;
    each value is first typed and checked by the parser as its command-line spelling would be, so a bad value is one
    error line naming the key and the file (or the flag) wherever it was written.
    """
    recipe = read_recipe(path)
    parser = _RecipeParser(path)
    actions = parser.actions()
    hints = {name: hint for dtype in RECIPE_TYPES for name, hint in typing.get_type_hints(dtype).items()}
    defaults = {}
    for key, value in recipe.items():
        try:
            defaults[key] = parser.typed(actions[key], hints[key], value)
        except ValueError as error:
            raise InputError(f"{key} in {path}: {error}") from None
    overrides = unset_nulls(overrides, hints, defaults)
    parser.set_defaults(**defaults)
    required = [action.dest for action in actions.values() if action.required and action.dest not in recipe]
    for action in parser._actions:  # a required key the recipe leaves out is reported below, in recipe terms
        action.required = False
    try:
        *parsed, rest = parser.parse_args_into_dataclasses(args=list(overrides), return_remaining_strings=True)
    except argparse.ArgumentError as error:  # only the command line is left for argparse to reject
        raise InputError(f"{error.argument_name.split('/')[0]}: {error.message}") from None
    except ValueError as error:  # a dataclass rejected a value (range, combination)
        raise InputError(one_line(error)) from None
    unset = [key for key in required if any(getattr(args, key, None) is None for args in parsed if hasattr(args, key))]
    if unset:
        raise InputError(f"{path} sets no {', '.join(unset)}: add to the recipe or pass "
                         f"{' '.join(f'--{key} VALUE' for key in unset)}.")
    for token in rest:
        if token.startswith("-"):
            raise InputError(f"{token.split('=')[0]}: no such recipe key{_did_you_mean(token, '--')}; "
                              "`trims train --help-keys` lists them.")
    if rest:
        raise InputError(f"unexpected argument {rest[0]!r}: overrides are --key value pairs.")
    return tuple(parsed)


def recipe_help() -> str:
    """Every recipe key with its help string (``trims train --help-keys``)."""
    return HfArgumentParser(RECIPE_TYPES, prog="trims train --config FILE", allow_abbrev=False).format_help()
