"""Published numbers a run is shown beside (``trims eval --compare``): the TRIMS paper's Tables 1-2.

``trims_paper.json`` holds each table's accuracy (%) and tokens per step as printed, per method and benchmark,
with its table number and LaTeX label (``tests/test_published.py`` checks every cell against the paper's source).
Every row is named ``<method> (published, TRIMS paper, Table N)``, so a table or plot never passes a published
number off as the user's. They were measured with the paper's protocol, not this run's: they place a run on the
field's map, they are not a controlled comparison.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PAPER_FILE = Path(__file__).with_name("trims_paper.json")
COMPARE_CHOICES = {"paper:llada": "llada", "paper:dream": "dream"}
"""``--compare`` value -> the table of ``trims_paper.json`` it shows."""


@dataclass(frozen=True)
class PublishedResult:
    """One method's published accuracy and tokens per step on one task: what a table row and a plot point need."""

    method: str
    task: str
    accuracy: float
    """A fraction (0-1), as :class:`~trims_hf.evaluation.evaluate.EvalResult` holds it; the paper prints percent."""
    tokens_per_step: float
    source: str
    """Where the number is printed, e.g. ``TRIMS paper, Table 1``."""

    @property
    def model(self) -> str:
        """The row's name: the method, marked as a published number with its source."""
        return f"{self.method} (published, {self.source})"


def published_results(name: str) -> list[PublishedResult]:
    """Every row of the published table ``name`` (a :data:`COMPARE_CHOICES` key), one per method and task."""
    if name not in COMPARE_CHOICES:
        choices = " or ".join(COMPARE_CHOICES)
        raise ValueError(f"{name!r} is not a published table; choose {choices} (the TRIMS paper's Tables 1-2, "
                         "LLaDA-Instruct and Dream-Instruct).")
    paper = json.loads(PAPER_FILE.read_text())
    table = paper["tables"][COMPARE_CHOICES[name]]
    source = f"TRIMS paper, {table['table']}"
    return [PublishedResult(method, paper["benchmarks"][benchmark], accuracy / 100, tokens_per_step, source)
            for method, cells in table["rows"].items() for benchmark, (accuracy, tokens_per_step) in cells.items()]


__all__ = ["COMPARE_CHOICES", "PublishedResult", "published_results"]
