"""The `evaluate` metric modules shipped with trims_hf; load one with
``evaluate.load(metric_path("math_accuracy"))`` (works offline)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import evaluate

_ROOT = Path(__file__).resolve().parent


def available_metrics() -> list[str]:
    """Names of the shipped metric modules (folders holding ``<name>/<name>.py``)."""
    return sorted(p.name for p in _ROOT.iterdir() if (p / f"{p.name}.py").is_file())


def metric_path(name: str) -> str:
    """Folder of a shipped metric module, for ``evaluate.load``."""
    if name not in available_metrics():
        raise KeyError(f"unknown metric {name!r}; shipped metrics: {', '.join(available_metrics())}")
    return str(_ROOT / name)


def metric_info(description: str, inputs_description: str, **columns: str) -> evaluate.MetricInfo:
    """The ``MetricInfo`` every shipped metric returns: its docs and one ``datasets.Value`` dtype per input column."""
    import datasets
    import evaluate

    return evaluate.MetricInfo(
        description=description,
        citation="",
        inputs_description=inputs_description,
        features=datasets.Features({name: datasets.Value(dtype) for name, dtype in columns.items()}),
    )
