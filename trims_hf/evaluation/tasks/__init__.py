"""Benchmark tasks of the paper (GSM8K, MATH-500, HumanEval, MBPP): data, prompts, grading. (The studies'
arithmetic word problems are :mod:`trims_hf.studies.arith`.)

``get_task("mbpp", style="3shot")`` builds a benchmark task by name; options go to the task's constructor.
"""

from __future__ import annotations

from typing import Any

from .base import BOXED_INSTRUCTION, CodeExecutionDisabled, CodeTask, Example, Grade, Task, TaskDataError
from .gsm8k import GSM8KTask
from .humaneval import HumanEvalTask
from .math_task import Math500Task
from .mbpp import MBPPTask
from .sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    bubblewrap_command,
    bubblewrap_problem,
    run_program,
    run_tests,
)

registry: dict[str, type[Task]] = {
    "gsm8k": GSM8KTask,
    "math500": Math500Task,
    "humaneval": HumanEvalTask,
    "mbpp": MBPPTask,
}


def get_task(name: str, **options: Any) -> Task:
    """A fresh task instance by registry name."""
    if name not in registry:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(sorted(registry))}")
    return registry[name](**options)


__all__ = [
    "BOXED_INSTRUCTION",
    "CodeExecutionDisabled",
    "CodeTask",
    "Example",
    "GSM8KTask",
    "Grade",
    "HumanEvalTask",
    "MBPPTask",
    "Math500Task",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "Task",
    "TaskDataError",
    "bubblewrap_command",
    "bubblewrap_problem",
    "get_task",
    "registry",
    "run_program",
    "run_tests",
]
