"""What every benchmark task provides: examples, prompts, stop strings, extraction and grading.

A task knows nothing about decoding: the decoder receives ``build_prompt(...)`` and
``stop_strings`` and hands back completion text, which ``grade`` judges.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import datasets

from ...prompts import Prompt, join_messages, render_prompt, resolved_format, uses_chat_template
from ...settings import PromptFormat
from .extraction import code_block
from .sandbox import Isolation, SandboxLimits, run_tests

Messages = list[dict[str, str]]

# The zero-shot chain-of-thought instruction of the paper's baselines (Fast-dLLM, dParallel, d3LLM).
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class TaskDataError(ValueError):
    """A data row lacks a field or has the wrong type; the message names the file, row and field."""


class CodeExecutionDisabled(PermissionError):
    """Grading a code task needs the explicit opt-in ``execute_code=True``."""


class Grade(TypedDict):
    """Result of grading one completion."""

    correct: bool
    extracted: Any  # the answer or program that was judged (None when nothing was found)
    error: str | None  # why it is wrong or could not be judged (None when correct)
    isolation: NotRequired[str]  # code tasks: the sandbox that ran the code ("bubblewrap" or "process")


@dataclass(frozen=True)
class Example:
    """One benchmark item. ``fields`` keeps the source row so tasks can reach every column."""

    id: str
    fields: Mapping[str, Any] = field(repr=False)


JSON_ROWS_SUFFIXES = (".jsonl", ".json")
"""The files :func:`read_json_rows` reads."""


class Task(ABC):
    """Base class; subclasses set the class attributes and implement the abstract methods."""

    name: str
    hub_id: str
    hub_config: str | None = None
    default_split: str = "test"
    data_file_suffixes: tuple[str, ...] = JSON_ROWS_SUFFIXES
    """The local copies ``load(data_file)`` reads."""
    stop_strings: tuple[str, ...] = ()

    # -- data ---------------------------------------------------------------------------------
    def load(self, data_file: str | None = None, limit: int | None = None, split: str | None = None) -> list[Example]:
        """Examples from ``data_file`` (a local JSON/JSONL copy) or, by default, from the Hub."""
        split = split or self.default_split
        if data_file is not None:
            rows: Iterable[Mapping[str, Any]] = self._read_file(data_file)
            source = data_file
        else:
            rows = self._hub_rows(split)
            source = f"{self.hub_id} ({split})"
        examples = self._select([self._to_example(row, i, source) for i, row in enumerate(rows)], split)
        return examples if limit is None else examples[:limit]

    def _read_file(self, data_file: str) -> Iterable[Mapping[str, Any]]:
        return read_json_rows(data_file)

    def _hub_rows(self, split: str) -> Iterable[Mapping[str, Any]]:
        return datasets.load_dataset(self.hub_id, self.hub_config, split=split)

    def _select(self, examples: list[Example], split: str) -> list[Example]:
        """Keep the examples of ``split``; only needed where a file holds several splits (MBPP)."""
        return examples

    @abstractmethod
    def _to_example(self, row: Mapping[str, Any], index: int, source: str) -> Example:
        """Validate one source row and wrap it."""

    # -- prompting ----------------------------------------------------------------------------
    @abstractmethod
    def messages(self, example: Example) -> Messages:
        """The prompt as chat messages (the last one from the user)."""

    @abstractmethod
    def prompt_format(self, tokenizer: Any = None) -> dict[str, Any]:
        """What shaped the prompt (template, shots, instruction): store it with every result."""

    def prompt(self, example: Example, tokenizer: Any, fmt: PromptFormat | None = None) -> Prompt:
        """What the decoder renders (:func:`trims_hf.prompts.prompt_token_ids`): the chat messages when the
        tokenizer's chat template applies, else the task's plain-text form."""
        fmt = fmt or PromptFormat()
        messages = self.messages(example)
        return messages if uses_chat_template(tokenizer, fmt) else self.plain_text(messages)

    def build_prompt(self, example: Example, tokenizer: Any = None, fmt: PromptFormat | None = None) -> Messages | str:
        """Chat messages without a tokenizer; with one, the prompt text exactly as the decoder renders it."""
        if tokenizer is None:
            return self.messages(example)
        return render_prompt(tokenizer, self.prompt(example, tokenizer, fmt), fmt or PromptFormat())[0]

    def plain_text(self, messages: Messages) -> str:
        """Messages joined for a model without a chat template (as :func:`trims_hf.prompts.render_prompt` joins them)."""
        return join_messages(messages)

    def template_name(self, tokenizer: Any) -> str:
        return "messages" if tokenizer is None else resolved_format(tokenizer, PromptFormat())

    # -- judging ------------------------------------------------------------------------------
    @abstractmethod
    def reference(self, example: Example) -> str | None:
        """The gold answer as a reader checks it (a number, a LaTeX answer, a reference program), stored with
        every graded sample so a verdict can be checked by eye."""

    @abstractmethod
    def extract(self, completion_text: str) -> Any:
        """The answer (or program) in a completion; None when there is none."""

    @abstractmethod
    def grade(self, example: Example, completion_text: str, execute_code: bool = False) -> Grade:
        """Judge one completion against ``example``."""


class CodeTask(Task):
    """A task whose answers are programs, judged by running the task's tests in the sandbox."""

    isolation: Isolation = "auto"
    """The sandbox's isolation (:func:`~trims_hf.evaluation.tasks.sandbox.resolve_isolation`); ``trims eval`` sets what the user
    accepted, so a run never falls back to weaker isolation than that."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()

    @abstractmethod
    def solution_and_tests(self, example: Example, completion_text: str) -> tuple[str, str]:
        """The program the solution process runs, and the tests the judge process runs against it."""

    def entry_points(self, example: Example) -> tuple[str, ...]:
        """The functions under test: the tests may take these from the solution even where they are
        builtins' names (every other builtin name stays the builtin, so a solution cannot fake it)."""
        return ()

    def extract(self, completion_text: str) -> str:
        return code_block(completion_text)

    def grade(self, example: Example, completion_text: str, execute_code: bool = False) -> Grade:
        """Run the solution against the tests; refuses unless ``execute_code`` is True."""
        if not execute_code:
            raise CodeExecutionDisabled(
                f"{self.name}: grading runs model-written code; pass execute_code=True to run it in the sandbox"
            )
        solution, tests = self.solution_and_tests(example, completion_text)
        result = run_tests(solution, tests, self.limits, self.isolation, entry_points=self.entry_points(example))
        error = None if result.passed else f"{result.status}: {result.reason}"
        return Grade(correct=result.passed, extracted=self.extract(completion_text), error=error,
                     isolation=result.isolation)


def read_json_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file, or of a JSON file holding one array of objects."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskDataError(f"{path}: line {number} is not valid JSON ({e.msg})") from e
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TaskDataError(f"{path}: row {i} is a {type(row).__name__}, expected a JSON object")
    return rows


def write_json_rows(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Rows as a JSONL file that :func:`read_json_rows` reads back, written atomically."""
    from ...reports import write_atomic

    write_atomic(Path(path), "".join(json.dumps(dict(row)) + "\n" for row in rows))


JSON_KINDS = {str: "a string", int: "a number", float: "a number", bool: "true or false", list: "a list",
              dict: "an object", type(None): "null"}
"""How a data file's user knows the Python types its JSON values read as."""


def require(row: Mapping[str, Any], key: str, kind: type | tuple[type, ...], index: int, source: str) -> Any:
    """``row[key]`` after checking it exists and has type ``kind``."""
    if key not in row:
        raise TaskDataError(f"{source}: row {index} has no field {key!r} (fields: {sorted(row)})")
    value = row[key]
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        expected = " or ".join(dict.fromkeys(JSON_KINDS.get(k, k.__name__) for k in kinds))
        raise TaskDataError(f"{source}: row {index} field {key!r} is {JSON_KINDS.get(type(value), type(value).__name__)}, "
                            f"expected {expected}")
    return value
