"""Model card of a TRIMS adapter: what it was trained from, with which settings, and how well it decodes.

The YAML header carries the machine-readable facts (``base_model``, ``datasets``, ``library_name: peft``,
the hyper-parameters under ``trims:``, and a ``model-index`` for the evaluation table), so the Hub can
link the adapter to its base model and data set and show the results.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .hub import METADATA_KEY, PAPER_CITATION, PAPER_TITLE
from .reports import markdown_table

EVAL_METRICS = ("accuracy", "tokens_per_step")
"""Decoding metrics shown in the card, read from logged keys ``eval_<task>_<metric>``."""
_EVAL_KEY = re.compile(rf"^eval_(?P<task>.+)_(?P<metric>{'|'.join(EVAL_METRICS)})$")


def evaluation_from_logs(log_history: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """The latest ``eval_<task>_accuracy`` / ``eval_<task>_tokens_per_step`` values of a Trainer log history."""
    results: dict[str, dict[str, float]] = {}
    for entry in log_history:
        for key, value in entry.items():
            match = _EVAL_KEY.match(key)
            if match:
                results.setdefault(match["task"], {})[match["metric"]] = float(value)
    return results


def _is_hub_id(source: str) -> bool:
    return not Path(source).exists() and source.count("/") == 1


def trims_model_card(
    *,
    base_model: str,
    dataset: str,
    hyperparameters: Mapping[str, Mapping[str, Any]],
    evaluation: Mapping[str, Mapping[str, float]] | None = None,
    base_model_revision: str | None = None,
    model_name: str = "trims-adapter",
    license: str | None = None,
) -> ModelCard:
    """Build the card of an adapter trained with TRIMS (or the MDLM baseline when ``trajectory_ratio`` is 0).

    ``hyperparameters`` maps a section name (e.g. "TRIMS", "optimisation", "LoRA") to its settings;
    ``evaluation`` maps a task to its metrics (see :data:`EVAL_METRICS`); ``model_name`` is the adapter's
    repo id (or folder), used in the loading example.
    """
    evaluation = evaluation or {}
    eval_results = [
        EvalResult(task_type="text-generation", dataset_type=task, dataset_name=task, metric_type=metric,
                   metric_name=metric, metric_value=value)
        for task, metrics in evaluation.items() for metric, value in metrics.items()
    ]
    trims_ratio = hyperparameters.get("TRIMS", {}).get("trajectory_ratio")
    data = ModelCardData(
        base_model=base_model if _is_hub_id(base_model) else None,
        datasets=[dataset] if _is_hub_id(dataset) else None,
        library_name="peft",
        license=license,
        tags=["trims", "mdlm", "masked-diffusion", "lora"],
        model_name=model_name,
        eval_results=eval_results or None,
        **{METADATA_KEY: {"base_model_revision": base_model_revision, "dataset": dataset,
                          **{name: dict(values) for name, values in hyperparameters.items()}}},
    )
    method = "the plain MDLM objective (trajectory_ratio 0, the paper's baseline)" if trims_ratio == 0 else "TRIMS"
    revision = f" (revision `{base_model_revision}`)" if base_model_revision else ""
    settings = "\n\n".join(
        f"### {name}\n\n" + markdown_table(["setting", "value"], [[f"`{key}`", f"`{value}`"] for key, value in values.items()])
        for name, values in hyperparameters.items()
    )
    results = markdown_table(
        ["task", *EVAL_METRICS],
        [[task, *(f"{metrics[m]:.4g}" if m in metrics else "-" for m in EVAL_METRICS)] for task, metrics in evaluation.items()],
    ) if evaluation else "No decoding evaluation was run with this training job (see `trims eval`)."
    content = f"""---
{data.to_yaml()}
---

# {model_name}

A LoRA adapter for the masked diffusion language model `{base_model}`{revision}, fine-tuned with {method}
on the teacher-scored data set `{dataset}`, following *{PAPER_TITLE}*.

## Usage

```python
from peft import PeftModel
from trims_hf import load_student

base = load_student("{base_model}"{f', revision="{base_model_revision}"' if base_model_revision else ""})
model = PeftModel.from_pretrained(base, "{model_name}")
```

or `trims eval --adapter {model_name}`.

## Evaluation

{results}

## Training settings

{settings}

## Citation

```bibtex
{PAPER_CITATION}
```
"""
    return ModelCard(content)
