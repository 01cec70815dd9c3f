"""Benchmark evaluation of a student: accuracy and decoding parallelism, threshold sweeps, tables, frontier plots.

:func:`evaluate_task` composes the library: a task's examples and prompts, the parallel decoder with a
:class:`TokensPerStepRecorder`, the task's stop strings and grader. Tokens per step is the ratio of totals
``sum(counted tokens) / sum(forwards)``; counted tokens exclude the prompt, the EOS tail and everything from
the task's first stop string on. Every result carries the prompt format, the decoding settings and whether
early stop was on, because each of them moves the numbers.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from .generation import (
    DecodeHook,
    DecodingConfig,
    GenerationOutput,
    GenerationStart,
    TokensPerStepRecorder,
    generate_text,
)
from .settings import PromptFormat
from .reports import markdown_table
from .tasks import CodeExecutionDisabled, CodeTask, Task, get_task

# The knob each decoding strategy is swept over.
SWEEP_PARAMETER = {"threshold": "threshold", "entropy": "entropy_threshold", "factor": "factor", "fixed_steps": "steps"}


@dataclass
class SampleRecord:
    """One graded completion; ``generated_tokens`` is what counts towards tokens per step."""

    prompt_id: str
    completion: str
    extracted: Any
    correct: bool
    error: str | None
    generated_tokens: int
    non_eos_tokens: int
    nfe: int
    isolation: str | None = None  # code tasks: the sandbox that ran the code ("bubblewrap" or "process")


@dataclass
class EvalResult:
    """Accuracy and parallelism of one model on one task under one decoding setting."""

    model: str
    task: str
    accuracy: float
    tokens_per_step: float
    """Counted tokens over forwards, a ratio of totals over samples (the paper's "TPS")."""
    tokens_per_forward_non_eos: float
    """Non-EOS response tokens (end-of-turn token included) before a task stop string over the same forwards:
    the count of Fast-dLLM / dParallel / d3LLM's evaluation scripts (their "TPF")."""
    tokens_per_second: float
    """Counted tokens over decoding wall time (not the paper's TPS)."""
    nfe: int
    generated_tokens: int
    non_eos_tokens: int
    num_samples: int
    decode_time_s: float
    wall_time_s: float
    early_stop: bool
    prompt_format: dict[str, Any]
    decoding: dict[str, Any]
    samples: list[SampleRecord] = field(default_factory=list)

    @property
    def setting(self) -> str:
        """The swept knob and its value, e.g. ``threshold 0.9``."""
        strategy = self.decoding["strategy"]
        return f"{strategy} {self.decoding[SWEEP_PARAMETER[strategy]]}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (samples included)."""
        return asdict(self)


class _Responses(DecodeHook):
    """Keeps the response ids of the last decoded batch, so counting can cut them at a stop string."""

    def __init__(self) -> None:
        self.ids: dict[Hashable, list[int]] = {}
        self._sample_ids: tuple[Hashable, ...] = ()

    def on_start(self, start: GenerationStart) -> None:
        self._sample_ids = start.sample_ids

    def on_end(self, output: GenerationOutput) -> None:
        self.ids = dict(zip(self._sample_ids, output.responses.tolist()))


def cut_at_stop_strings(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest stop string."""
    cuts = [index for stop in stop_strings if (index := text.find(stop)) >= 0]
    return text[: min(cuts)] if cuts else text


def tokens_covering(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], num_chars: int) -> int:
    """Fewest leading tokens of ``ids`` whose decoded text reaches ``num_chars`` characters.

    A token straddling a stop string counts (it produced text before it); decoding prefixes instead of
    re-tokenising the cut text keeps the model's own token boundaries.
    """
    return bisect.bisect_left(
        range(len(ids) + 1), num_chars, key=lambda n: len(tokenizer.decode(ids[:n], skip_special_tokens=True))
    )


def check_task_inputs(task: Task, data_file: str | None, execute_code: bool) -> None:
    """Fail before any model work: missing data file, or a code task without the execution opt-in."""
    if data_file is not None and not Path(data_file).is_file():
        raise FileNotFoundError(f"data file not found: {data_file}")
    if isinstance(task, CodeTask) and not execute_code:
        raise CodeExecutionDisabled(
            f"{task.name} is graded by running model-written code; pass execute_code=True "
            "(CLI: --allow-code-execution) to run it in the sandbox"
        )


def _model_name(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__


def evaluate_task(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    task: Task | str,
    config: DecodingConfig | None = None,
    limit: int | None = None,
    data_file: str | None = None,
    execute_code: bool = False,
    batch_size: int = 1,
    progress: bool = True,
    hooks: Sequence[DecodeHook] = (),
    model_name: str | None = None,
    prompt_format: PromptFormat | None = None,
) -> EvalResult:
    """Decode and grade ``limit`` examples of ``task``; extra ``hooks`` (e.g. a ``TrajectoryRecorder``)
    see every batch, with the examples' ids as sample ids."""
    task = get_task(task) if isinstance(task, str) else task
    config = config or DecodingConfig()
    check_task_inputs(task, data_file, execute_code)
    started = time.perf_counter()
    examples = task.load(data_file=data_file, limit=limit)
    recorder, responses = TokensPerStepRecorder(), _Responses()
    records: list[SampleRecord] = []
    for begin in tqdm(range(0, len(examples), batch_size), desc=task.name, disable=not progress):
        batch = examples[begin : begin + batch_size]
        prompts = [task.prompt(e, tokenizer, prompt_format) for e in batch]
        texts = generate_text(model, tokenizer, prompts, config, [recorder, responses, *hooks], [e.id for e in batch],
                              prompt_format)
        for example, text in zip(batch, texts):
            completion = cut_at_stop_strings(text, task.stop_strings)
            if completion != text:
                ids = responses.ids[example.id][: recorder.samples[example.id]["tokens"]]
                recorder.finalize(example.id, tokens_covering(tokenizer, ids, len(completion)))
            grade = task.grade(example, completion, execute_code=execute_code)
            counts = recorder.samples[example.id]
            records.append(SampleRecord(example.id, completion, grade["extracted"], bool(grade["correct"]),
                                        grade["error"], counts["tokens"], counts["non_eos_tokens"], counts["nfe"],
                                        grade.get("isolation")))
    summary = recorder.summary()
    return EvalResult(
        model=model_name or _model_name(model),
        task=task.name,
        accuracy=sum(r.correct for r in records) / len(records) if records else 0.0,
        tokens_per_step=summary["tokens_per_step"],
        tokens_per_forward_non_eos=summary["tokens_per_forward_non_eos"],
        tokens_per_second=summary["tokens_per_second"],
        nfe=summary["nfe"],
        generated_tokens=summary["generated_tokens"],
        non_eos_tokens=summary["non_eos_tokens"],
        num_samples=len(records),
        decode_time_s=summary["wall_time_s"],
        wall_time_s=time.perf_counter() - started,
        early_stop=config.early_stop,
        prompt_format=task.prompt_format(tokenizer),
        decoding=asdict(config),
        samples=records,
    )


def sweep(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    task: Task | str,
    values: Sequence[float],
    config: DecodingConfig | None = None,
    **kwargs: Any,
) -> list[EvalResult]:
    """One :func:`evaluate_task` per value of the strategy's knob (threshold tau by default), for a frontier."""
    config = config or DecodingConfig()
    parameter = SWEEP_PARAMETER[config.strategy]
    cast = int if parameter == "steps" else float
    return [evaluate_task(model, tokenizer, task, replace(config, **{parameter: cast(v)}), **kwargs) for v in values]


def format_table(results: Sequence[EvalResult]) -> str:
    """Markdown table like the paper's Tables 1-2: a row per model and setting, Acc (%) and Tokens/step per task."""
    tasks = list(dict.fromkeys(r.task for r in results))
    rows: dict[tuple[str, str], dict[str, EvalResult]] = {}
    for result in results:
        rows.setdefault((result.model, result.setting), {})[result.task] = result
    header = ["Model", "Setting"] + [f"{task} {column}" for task in tasks for column in ("Acc", "Tokens/step")]
    body = []
    for (model, setting), by_task in rows.items():
        cells = [model, setting]
        for task in tasks:
            result = by_task.get(task)
            cells += [f"{100 * result.accuracy:.1f}", f"{result.tokens_per_step:.2f}"] if result else ["-", "-"]
        body.append(cells)
    early_stop = ", ".join(sorted({"on" if r.early_stop else "off" for r in results}))
    return (markdown_table(header, body) + "\n\nTokens/step: generated tokens (no EOS, nothing after stop strings) "
            f"per forward, ratio of totals; early stop: {early_stop}.")


def plot_frontier(results: Sequence[EvalResult], path: str | Path | None = None) -> Figure:
    """Accuracy against tokens per step, one panel per task and one line per model (the paper's Figures 3-4)."""
    tasks = list(dict.fromkeys(r.task for r in results))
    models = list(dict.fromkeys(r.model for r in results))  # one colour per model across panels
    # The object-oriented Figure API draws without pyplot, so the user's matplotlib backend is left alone.
    figure = Figure(figsize=(4.0 * len(tasks), 3.5), layout="constrained")
    axes = figure.subplots(1, len(tasks), squeeze=False)
    for axis, task in zip(axes[0], tasks):
        by_model: dict[str, list[EvalResult]] = {}
        for result in results:
            if result.task == task:
                by_model.setdefault(result.model, []).append(result)
        for model, points in by_model.items():
            points = sorted(points, key=lambda r: r.tokens_per_step)
            axis.plot([r.tokens_per_step for r in points], [100 * r.accuracy for r in points], marker="o", label=model,
                      color=f"C{models.index(model) % 10}")
            for point in points:
                axis.annotate(point.setting.split()[-1], (point.tokens_per_step, 100 * point.accuracy), fontsize=7)
        axis.set(title=task, xlabel="tokens per step", ylabel="accuracy (%)")
        axis.grid(alpha=0.3)
    # One legend below the panels: model names (paths, adapters) are often longer than a panel is wide.
    legend = {label: handle for axis in axes[0] for handle, label in zip(*axis.get_legend_handles_labels())}
    figure.legend(legend.values(), legend.keys(), loc="outside lower center", fontsize=8)
    if path is not None:
        figure.savefig(path, bbox_inches="tight", dpi=120)
    return figure
