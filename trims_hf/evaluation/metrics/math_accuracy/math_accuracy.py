"""Accuracy on GSM8K (numeric match) or MATH-500 (math-verify), with the tasks' answer extraction.

``evaluate.load(trims_hf.evaluation.metrics.metric_path("math_accuracy"))``, then
``compute(predictions=completions, references=gold_answers, task="gsm8k" | "math500")``.
"""

import evaluate

from trims_hf.evaluation.metrics import metric_info
from trims_hf.evaluation.tasks import GSM8KTask, Math500Task

_TASKS = {"gsm8k": GSM8KTask, "math500": Math500Task}

_DESCRIPTION = "Share of completions whose extracted final answer matches the reference answer."

_KWARGS_DESCRIPTION = """
Args:
    predictions: completion texts, one per example.
    references: gold answers: for gsm8k a number or the dataset's full answer ("... #### 18"),
        for math500 the dataset's `answer` column (LaTeX).
    task: "gsm8k" (last \\boxed{}, else "#### X", else last number; exact numeric comparison) or
        "math500" (last \\boxed{}; math-verify equivalence).
Returns:
    accuracy: fraction of correct completions.
    correct: per-example booleans.
    extracted: per-example extracted answers (None when none was found).
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MathAccuracy(evaluate.Metric):
    """Math answer accuracy that reuses trims_hf.evaluation.tasks' extraction and grading, so the metric and
    the benchmark runner can never disagree."""

    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, predictions="string", references="string")

    def _compute(self, predictions: list[str], references: list[str], task: str = "gsm8k") -> dict:
        if task not in _TASKS:
            raise ValueError(f"math_accuracy: task must be one of {sorted(_TASKS)}, not {task!r}")
        grader = _TASKS[task]()
        grades = [grader.grade_answer(p, r) for p, r in zip(predictions, references)]
        correct = [g["correct"] for g in grades]
        return {
            "accuracy": sum(correct) / len(correct) if correct else 0.0,
            "correct": correct,
            "extracted": [g["extracted"] for g in grades],
        }
