"""AUP against values worked by hand, and the shipped published rows against the paper's LaTeX tables."""

from __future__ import annotations

import math
import re

import pytest
from conftest import SHARED, needs_shared

from trims_hf.evaluation.aup import accuracy_under_parallelism, accuracy_weight
from trims_hf.evaluation.published import COMPARE_CHOICES, published_results

PAPER = SHARED / "paper" / "trims.tex"


def test_aup_of_a_three_point_curve_by_hand():
    """(1, 80), (2, 78), (4, 76), y_max 80: W(80) = 1, W(78) = e^-0.075 = 0.927743, W(76) = e^-0.15 = 0.860708;
    AUP = 1 x 80 + 1/2 x 1 x (78 x 0.927743 + 80) + 1/2 x 2 x (76 x 0.860708 + 78 x 0.927743)
        = 80 + 76.18198 + 137.77777 = 293.95975."""
    curve = [(1.0, 80.0), (2.0, 78.0), (4.0, 76.0)]
    assert accuracy_weight(78.0, 80.0) == pytest.approx(0.927743, abs=1e-6)
    assert accuracy_under_parallelism(curve) == pytest.approx(293.95975, abs=1e-4)
    assert accuracy_under_parallelism(curve[::-1]) == pytest.approx(293.95975, abs=1e-4)  # sorted by parallelism


def test_aup_leaves_out_points_more_than_five_below_the_first_and_weights_by_the_given_best():
    curve = [(1.0, 80.0), (2.0, 78.0), (4.0, 76.0)]
    assert accuracy_under_parallelism([*curve, (6.0, 74.9)]) == pytest.approx(293.95975, abs=1e-4)
    # y_max 100 (a better method on the task): W(80) = e^-0.6, W(78) = e^-0.66, W(76) = e^-0.72.
    w80, w78, w76 = math.exp(-0.6), math.exp(-0.66), math.exp(-0.72)
    by_hand = 80 + 0.5 * (78 * w78 + 80 * w80) + 1.0 * (76 * w76 + 78 * w78)
    assert accuracy_under_parallelism(curve, y_max=100.0) == pytest.approx(by_hand)
    assert accuracy_under_parallelism([(9.11, 73.1)]) == pytest.approx(9.11 * 73.1)  # one point: rho x y
    assert accuracy_under_parallelism([(1.0, 0.0), (2.0, 0.0)]) == 0.0  # all wrong: 0, not 0 / 0


@pytest.mark.parametrize("points, y_max, message", [
    ([], None, "at least one"), ([(0.0, 50.0)], None, "parallelism must be"),
    ([(1.0, 0.5), (2.0, 150.0)], None, r"accuracy is a percentage in \[0, 100\], got 150\.0"),
    ([(1.0, 50.0)], float("nan"), r"y_max is a percentage in \[0, 100\], got nan"),
    ([(1.0, 50.0)], 150.0, r"y_max is a percentage"),
    ([(1.0, 50.0), (2.0, 40.0)], 0.0, r"y_max=0.0 is below this curve's best accuracy 50.0"),
    ([(1.0, 50.0), (2.0, 60.0)], 55.0, r"y_max=55.0 is below this curve's best accuracy 60.0")])
def test_aup_refuses_what_it_cannot_score(points, y_max, message):
    with pytest.raises(ValueError, match=message):
        accuracy_under_parallelism(points, y_max=y_max)


def tex_table(label: str) -> dict[str, list[float]]:
    """``{method: [acc, tps] x 4 benchmarks}`` read from the rows of the LaTeX table ``label``."""
    tex = PAPER.read_text()
    end = tex.index(rf"\label{{{label}}}")
    start = tex.rindex(r"\midrule", 0, end)
    rows = {}
    for line in tex[start:tex.index(r"\bottomrule", start)].splitlines():
        if "&" in line:
            cells = [re.sub(r"\\textbf|\\underline|[${}\\\s]", "", cell) for cell in line.split("&")]
            rows["TRIMS" if cells[0] == "method" else cells[0]] = [float(cell) for cell in cells[1:]]
    return rows


@needs_shared(PAPER)
@pytest.mark.parametrize("name, label", [("paper:llada", "tab:main-results-llada"),
                                         ("paper:dream", "tab:main-results-dream")])
def test_published_rows_equal_the_papers_tables(name, label):
    order = ["gsm8k", "math500", "mbpp", "humaneval"]  # the tables' column order: GSM8K, MATH, MBPP, HumanEval
    shipped: dict[str, list[float]] = {}
    for row in sorted(published_results(name), key=lambda r: order.index(r.task)):
        shipped.setdefault(row.method, []).extend([round(100 * row.accuracy, 1), row.tokens_per_step])
    assert shipped == tex_table(label)


def test_published_rows_by_hand():
    llada = {(r.method, r.task): r for r in published_results("paper:llada")}
    dream = {(r.method, r.task): r for r in published_results("paper:dream")}
    assert (llada["TRIMS", "gsm8k"].accuracy, llada["TRIMS", "gsm8k"].tokens_per_step) == pytest.approx((0.749, 6.26))
    assert (llada["d3LLM", "math500"].accuracy, llada["d3LLM", "math500"].tokens_per_step) == pytest.approx((0.304, 5.74))
    assert (dream["TRIMS", "mbpp"].accuracy, dream["TRIMS", "mbpp"].tokens_per_step) == pytest.approx((0.566, 6.31))
    assert (dream["Fast-dLLM-v2", "humaneval"].accuracy, dream["Fast-dLLM-v2", "humaneval"].tokens_per_step) == pytest.approx(
        (0.617, 2.58))
    assert {r.method for r in llada.values()} == {"LLaDA", "Fast-dLLM", "D2F", "dParallel", "d3LLM", "TRIMS"}
    assert {r.method for r in dream.values()} == {"Dream", "Fast-dLLM", "Fast-dLLM-v2", "dParallel", "d3LLM", "TRIMS"}
    assert len(llada) == len(dream) == 24 and llada["LLaDA", "gsm8k"].model == "LLaDA (published, TRIMS paper, Table 1)"
    assert dream["Dream", "gsm8k"].model == "Dream (published, TRIMS paper, Table 2)"


def test_an_unknown_table_names_the_choices():
    with pytest.raises(ValueError, match="choose paper:llada or paper:dream"):
        published_results("trims:llada")
    assert set(COMPARE_CHOICES) == {"paper:llada", "paper:dream"}
