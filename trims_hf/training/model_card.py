"""Model card of a TRIMS adapter: what it was trained from, with which settings, and how well it decodes.

The YAML header carries the machine-readable facts (``base_model``, ``datasets``, ``library_name: peft``,
the hyper-parameters, final training loss and library versions under ``trims:``, and a ``model-index`` for
the evaluation table), so the Hub can link the adapter to its base model and data set and show the results.
The card's ``trims eval`` line reproduces its evaluation table as written (same task, n and decoder).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..data.hub import METADATA_KEY, PAPER_CITATION, PAPER_TITLE
from ..evaluation.evaluate import SWEEP_PARAMETER, decoding_setting
from ..reports import library_versions, markdown_table
from ..settings import DecodingConfig

EVAL_METRICS = ("accuracy", "num_samples", "tokens_per_step")
"""Decoding metrics read from logged keys ``eval_<task>_<metric>`` (:class:`~trims_hf.training.callbacks.DecodeEvalCallback`);
accuracy is a fraction there and in the YAML, percent in the card's table."""
_EVAL_KEY = re.compile(rf"^eval_(?P<task>.+)_(?P<metric>{'|'.join(EVAL_METRICS)})$")
CODE_TASKS = ("humaneval", "mbpp")


def evaluation_from_logs(log_history: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """The latest ``eval_<task>_<metric>`` values (:data:`EVAL_METRICS`) of a Trainer log history."""
    results: dict[str, dict[str, float]] = {}
    for entry in log_history:
        for key, value in entry.items():
            match = _EVAL_KEY.match(key)
            if match:
                results.setdefault(match["task"], {})[match["metric"]] = float(value)
    return results


def training_loss_from_logs(log_history: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The last logged training loss and its step, and the Trainer's mean over the whole run (``train_loss``)."""
    summary: dict[str, float] = {}
    for entry in log_history:
        if "loss" in entry:
            summary.update(final_train_loss=float(entry["loss"]), final_step=int(entry.get("step", 0)))
        if "train_loss" in entry:
            summary["mean_train_loss"] = float(entry["train_loss"])
    return summary


def _plain(value: Any) -> Any:
    """Settings as YAML and readers want them: enum members as their values (``linear``, not ``SchedulerType.LINEAR``)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _is_hub_id(source: str) -> bool:
    return not Path(source).exists() and source.count("/") == 1


def _flag(name: str, value: Any) -> list[str]:
    """``--name value`` as the ``trims eval`` parser reads it (booleans as flags, ``--name`` / ``--no-name``; lists as
    separate words)."""
    if isinstance(value, bool):
        return [f"--{'' if value else 'no-'}{name.replace('_', '-')}"]
    values = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    return [f"--{name.replace('_', '-')}", *values]


def eval_command(base_model: str, adapter: str, task: str = "gsm8k", decoding: DecodingConfig | None = None,
                 limit: int | None = None, data_file: str | None = None, model_kind: str | None = None,
                 mask_token_id: int | None = None, base_model_revision: str | None = None) -> str:
    """The ``trims eval`` line that evaluates ``adapter`` as the card's table was made: the strategy, its knob, the
    lengths and every decoder setting that differs from the defaults are spelled out."""
    decoding = decoding or DecodingConfig()
    default = DecodingConfig()
    shown = {"strategy", SWEEP_PARAMETER[decoding.strategy], "gen_length", "block_length"}
    words = ["trims", "eval", *_flag("model_name_or_path", base_model)]
    optional = {"model_revision": base_model_revision, "adapter": adapter, "model_kind": model_kind,
                "mask_token_id": mask_token_id, "task": task, "data_file": data_file, "limit": limit}
    for name, value in optional.items():
        if value is not None:
            words += _flag(name, value)
    if task in CODE_TASKS:
        words.append("--allow-code-execution")
    for item in dataclasses.fields(DecodingConfig):
        value = getattr(decoding, item.name)
        if item.name == "seed" and decoding.temperature == 0:  # draws nothing: `trims eval` refuses it there
            continue
        if value is not None and (item.name in shown or value != getattr(default, item.name)):
            words += _flag(item.name, value)
    return shlex.join([*words, "--output", f"{task}-results.json"])


def fitting_decoder(positions: int | None) -> DecodingConfig:
    """The default decoder for a student of ``positions`` positions: its ``gen_length`` (and ``block_length`` with
    it) halved until at least half the positions are left to the prompt, so a suggested line runs on a small
    student too."""
    decoding = DecodingConfig()
    gen_length = decoding.gen_length
    while positions is not None and gen_length > max(1, positions // 2):
        gen_length //= 2
    return dataclasses.replace(decoding, gen_length=gen_length, block_length=min(decoding.block_length, gen_length))


def _decoding_text(decoding: DecodingConfig) -> str:
    """``threshold 0.9, gen 256, block 32, cache none, early stop on`` (plus temperature when sampling)."""
    text = (f"{decoding_setting(decoding)}, gen {decoding.gen_length}, block {decoding.block_length}, "
            f"cache {decoding.cache}, early stop {'on' if decoding.early_stop else 'off'}")
    return text + (f", temperature {decoding.temperature}" if decoding.temperature else "")


def trims_model_card(
    *,
    base_model: str,
    dataset: str,
    hyperparameters: Mapping[str, Mapping[str, Any]],
    log_history: Iterable[Mapping[str, Any]] = (),
    decoding: DecodingConfig | None = None,
    eval_data_file: str | None = None,
    model_kind: str | None = None,
    mask_token_id: int | None = None,
    base_model_revision: str | None = None,
    model_name: str = "trims-adapter",
    license: str | None = None,
    positions: int | None = None,
) -> ModelCard:
    """Build the card of an adapter trained with TRIMS (or the MDLM baseline when ``trajectory_ratio`` is 0).

    ``hyperparameters`` maps a section name (e.g. "TRIMS", "optimisation", "LoRA") to its settings;
    ``log_history`` is the Trainer's (final training loss, and the decode evaluation of
    :class:`~trims_hf.training.callbacks.DecodeEvalCallback` made with ``decoding`` on ``eval_data_file``);
    ``model_kind`` / ``mask_token_id`` are the student settings the base model needed, so the usage lines
    load it the same way; ``model_name`` is the adapter's repo id (or folder); ``positions`` (the base's
    ``max_position_embeddings``) sizes the suggested evaluation when no decode evaluation ran
    (:func:`fitting_decoder`).
    """
    log_history = list(log_history)
    evaluation = evaluation_from_logs(log_history)
    loss = training_loss_from_logs(log_history)
    versions = library_versions()
    hyperparameters = {name: _plain(values) for name, values in hyperparameters.items()}
    eval_results = [
        EvalResult(task_type="text-generation", dataset_type=task, dataset_name=task, metric_type=metric,
                   metric_name=metric, metric_value=value)
        for task, metrics in evaluation.items() for metric, value in metrics.items() if metric != "num_samples"
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
        **{METADATA_KEY: {"base_model_revision": base_model_revision, "dataset": dataset, "model_kind": model_kind,
                          "mask_token_id": mask_token_id, **hyperparameters, "training": loss,
                          "decoding": dataclasses.asdict(decoding) if decoding and evaluation else None,
                          "versions": versions}},
    )
    method = "the plain MDLM objective (trajectory_ratio 0, the paper's baseline)" if trims_ratio == 0 else "TRIMS"
    revision = f" (revision `{base_model_revision}`)" if base_model_revision else ""
    settings = "\n\n".join(
        f"### {name}\n\n" + markdown_table(["setting", "value"], [[f"`{key}`", f"`{value}`"] for key, value in values.items()])
        for name, values in hyperparameters.items()
    )
    task = next(iter(evaluation), "gsm8k")
    n = evaluation.get(task, {}).get("num_samples")
    command = eval_command(base_model, model_name, task, decoding or fitting_decoder(positions),
                           int(n) if n else None, eval_data_file, model_kind, mask_token_id, base_model_revision)
    if evaluation:
        decoder = _decoding_text(decoding or DecodingConfig())
        rows = [[name, f"{100 * m['accuracy']:.1f}" if "accuracy" in m else "-",
                 f"{m['num_samples']:.0f}" if "num_samples" in m else "-",
                 f"{m['tokens_per_step']:.2f}" if "tokens_per_step" in m else "-", decoder]
                for name, m in evaluation.items()]
        results = (markdown_table(["task", "accuracy (%)", "n", "tokens per step", "decoding"], rows)
                   + "\n\nMeasured on the first n problems at the last evaluation of the training run; reproduce with:"
                   + f"\n\n```bash\n{command}\n```")
    else:
        results = f"No decoding evaluation was run with this training job. Evaluate with:\n\n```bash\n{command}\n```"
    load_options = "".join(f", {key}={value!r}" for key, value in
                           (("kind", model_kind), ("mask_token_id", mask_token_id), ("revision", base_model_revision))
                           if value is not None)
    loss_text = (f"Final training loss {loss['final_train_loss']:.4f} at step {loss['final_step']}"
                 + (f" (mean over training {loss['mean_train_loss']:.4f})." if "mean_train_loss" in loss else ".")
                 if "final_train_loss" in loss else "No training loss was logged.")
    content = f"""---
{data.to_yaml()}
---

# {model_name}

A LoRA adapter for the masked diffusion language model `{base_model}`{revision}, fine-tuned with {method}
on the teacher-scored data set `{dataset}`, following *{PAPER_TITLE}*.

## Usage

```python
from trims_hf import load_student

model = load_student("{base_model}"{load_options}, adapter="{model_name}")   # a peft PeftModel, the base checked
```

## Evaluation

{results}

## Training

{loss_text}

{settings}

## Framework versions

{chr(10).join(f"- {name} {version}" for name, version in versions.items())}

## Citation

```bibtex
{PAPER_CITATION}
```
"""
    return ModelCard(content)
