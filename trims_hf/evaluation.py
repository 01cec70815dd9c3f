"""Benchmark evaluation of a student: accuracy and decoding parallelism, threshold sweeps, tables, frontier plots.

:func:`evaluate_task` composes the library: a task's examples and prompts, the parallel decoder with a
:class:`TokensPerStepRecorder`, the task's stop strings and grader. Tokens per step is the ratio of totals
``sum(counted tokens) / sum(forwards)``; counted tokens exclude the prompt, the EOS tail and everything from
the task's first stop string on. Every result carries the prompt format, the decoding settings, whether early
stop was on and the library versions, because each of them moves the numbers.

Accuracy is a fraction (0-1) next to ``num_samples`` in results and JSON (the ``evaluate`` convention); tables,
plots and model cards show it in percent with n. With ``records_file``, each graded sample is appended as it
finishes, so an interrupted evaluation resumes where it stopped (:class:`EvaluationInterrupted`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from .aup import ALPHA, Y_MIN_OFFSET, accuracy_under_parallelism
from .generation import (
    DecodeHook,
    DecodingConfig,
    TokensPerStepRecorder,
    generate_text,
    throughput,
)
from .prompts import resolved_format
from .published import PublishedResult
from .reports import library_versions, markdown_table, weights_fingerprint, write_json
from .settings import PromptFormat
from .tasks import (
    CodeExecutionDisabled,
    CodeTask,
    Example,
    Task,
    TaskDataError,
    get_task,
)

# The knob each decoding strategy is swept over.
SWEEP_PARAMETER = {"threshold": "threshold", "entropy": "entropy_threshold", "factor": "factor", "fixed_steps": "steps"}

RESULT_UNITS = {
    "accuracy": "fraction of num_samples graded correct, 0-1 (tables, plots and model cards show percent)",
    "tokens_per_step": "counted tokens (before EOS and task stop strings) per forward pass, ratio of totals",
    "tokens_per_forward_non_eos": "non-EOS response tokens before a task stop string per forward pass, ratio of totals",
    "tokens_per_second": "counted tokens per second of decoding wall time (the slowest process's decoding)",
    "decode_time_s": "seconds of decoding (model calls), summed over batches and processes",
    "wall_time_s": "seconds of the evaluation run that finished the result (data, decoding and grading of every "
                   "setting evaluated together)",
}
"""What each number of a result file measures; written at the top of every file :func:`save_results` writes."""


def decoding_setting(decoding: DecodingConfig | dict[str, Any]) -> str:
    """The strategy and the value of its swept knob, e.g. ``threshold 0.9``: how tables and plots name a setting."""
    values = asdict(decoding) if isinstance(decoding, DecodingConfig) else decoding
    return f"{values['strategy']} {values[SWEEP_PARAMETER[values['strategy']]]}"


@dataclass
class SampleRecord:
    """One graded completion: what the model saw, the gold answer, what was extracted and the verdict.
    ``generated_tokens`` is what counts towards tokens per step."""

    prompt_id: str
    prompt: str
    """The prompt text exactly as the model received it (chat template or plain form applied)."""
    reference: str | None
    """The task's gold answer (a number, a LaTeX answer, or a reference program for code tasks)."""
    completion: str
    extracted: Any
    correct: bool
    error: str | None
    generated_tokens: int
    non_eos_tokens: int
    nfe: int
    decode_time_s: float
    """This sample's share of its batch's decoding time."""
    isolation: str | None = None  # code tasks: the sandbox that ran the code ("bubblewrap" or "process")


@dataclass
class EvalResult:
    """Accuracy and parallelism of one model on one task under one decoding setting."""

    model: str
    task: str
    accuracy: float
    """Fraction of the ``num_samples`` graded samples that are correct (0-1)."""
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
    num_processes: int = 1
    """Processes that shared the work (the numbers do not depend on it, timings aside)."""
    samples: list[SampleRecord] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=library_versions)
    """Library versions the result was computed with (:func:`trims_hf.reports.library_versions`)."""

    @property
    def setting(self) -> str:
        """The swept knob and its value, e.g. ``threshold 0.9``."""
        return decoding_setting(self.decoding)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (samples included)."""
        return asdict(self)


class EvaluationInterrupted(KeyboardInterrupt):
    """Ctrl-C during an evaluation that saves its records: how far it got and where the records are."""

    def __init__(self, task: str, setting: str, done: int, total: int, records_file: Path) -> None:
        self.task, self.setting, self.done, self.total, self.records_file = task, setting, done, total, records_file
        super().__init__(f"{done} of {total} {task} problems ({setting}) saved in {records_file}; evaluate again with "
                         "the same settings and records file to resume")


def check_task_inputs(task: Task, data_file: str | None, execute_code: bool) -> None:
    """Fail before any model work: missing data file, or a code task without the execution opt-in."""
    if data_file is not None and not Path(data_file).is_file():
        raise FileNotFoundError(f"data file not found: {data_file}")
    if isinstance(task, CodeTask) and not execute_code:
        raise CodeExecutionDisabled(
            f"{task.name} is graded by running model-written code; pass execute_code=True to run it in the sandbox"
        )


def load_examples(task: Task, data_file: str | None = None, limit: int | None = None,
                  execute_code: bool = False) -> list[Example]:
    """The examples :func:`evaluate_task` decodes, after every check that needs no model, so that a wrong file,
    column or opt-in fails before a model loads."""
    check_task_inputs(task, data_file, execute_code)
    examples = task.load(data_file=data_file, limit=limit)
    if not examples:
        raise TaskDataError(f"{data_file or getattr(task, 'hub_id', task.name)}: no {task.name} examples to evaluate")
    return examples


def _model_name(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__


def run_fingerprint(model: nn.Module, model_name: str, task: Task, tokenizer: PreTrainedTokenizerBase,
                    config: DecodingConfig, prompt_format: PromptFormat, batch_size: int) -> str:
    """A short hash of everything that decides a sample's record: the model's name, its weights
    (:func:`~trims_hf.reports.weights_fingerprint`: a retrained adapter in the same folder differs), dtype and device,
    the task and prompt format, the decoding settings and the batch size (left padding moves the numerics). Records
    of another fingerprint are never reused."""
    parameters = list(model.parameters())
    key = {
        "model": model_name, "weights": weights_fingerprint(model),
        "dtype": str(parameters[0].dtype) if parameters else None,
        "device": parameters[0].device.type if parameters else None,
        "task": task.prompt_format(tokenizer), "prompt_format": asdict(prompt_format), "decoding": asdict(config),
        "batch_size": batch_size,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _rank_file(records_file: Path, rank: int | str) -> Path:
    return records_file.with_name(f"{records_file.stem}.rank-{rank}{records_file.suffix}")


def records_files(records_file: Path) -> list[Path]:
    """``records_file`` and the per-process files beside it (:func:`process_records_file`): a resumed run reads
    them all, whatever number of processes wrote them, since the units of work do not depend on it."""
    return [records_file, *sorted(records_file.parent.glob(_rank_file(records_file, "*").name))]


def process_records_file(records_file: Path, process_index: int, num_processes: int) -> Path:
    """Where one process appends its records: ``records_file`` itself when it is alone, else
    ``<stem>.rank-<k><suffix>``, so that processes never write to the same file."""
    return records_file if num_processes == 1 else _rank_file(records_file, process_index)


def _saved_records(files: Sequence[Path], fingerprints: set[str]) -> dict[tuple[str, str], SampleRecord]:
    """Records of these runs already in ``files``, by (fingerprint, prompt id); a line cut short by a crash is
    skipped (decoded again)."""
    saved: dict[tuple[str, str], SampleRecord] = {}
    for path in files:
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and (run := row.pop("run", None)) in fingerprints:
                saved[run, row["prompt_id"]] = SampleRecord(**row)
    return saved


class _AppendedLines:
    """Lines appended to ``files`` since it was made (one per record: every process's progress), reading only the
    bytes added since its last call."""

    def __init__(self, files: Sequence[Path]) -> None:
        self.offsets = {path: path.stat().st_size if path.is_file() else 0 for path in files}
        self.lines = 0

    def __call__(self) -> int:
        for path, offset in self.offsets.items():
            if path.is_file():
                with path.open("rb") as handle:
                    handle.seek(offset)
                    added = handle.read()
                self.offsets[path] = offset + len(added)
                self.lines += added.count(b"\n")
        return self.lines


def _append_records(records_file: Path, fingerprint: str, records: Sequence[SampleRecord]) -> None:
    """Append one JSON line per record and flush it to disk, so a crash loses at most the batch in flight."""
    records_file.parent.mkdir(parents=True, exist_ok=True)
    with records_file.open("a+", encoding="utf-8") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() > 0:  # a line torn by a crash must not swallow the next record
            handle.seek(handle.tell() - 1)
            torn = handle.read(1) != "\n"
            handle.seek(0, os.SEEK_END)
            if torn:
                handle.write("\n")
        for record in records:
            handle.write(json.dumps({"run": fingerprint, **asdict(record)}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _model_device(model: nn.Module) -> str:
    return next((p.device.type for p in model.parameters()), "cpu")


def unit_costs(prompt_tokens: Sequence[Sequence[int]], gen_lengths: Sequence[int]) -> list[int]:
    """The cost of decoding each (setting, batch) unit, settings outer: the batch's rows times its left-padded
    length (longest prompt plus the setting's generation length), what every forward of the batch processes."""
    return [len(batch) * (max(batch) + gen_length) for gen_length in gen_lengths for batch in prompt_tokens]


def evaluate_task(model: nn.Module, tokenizer: PreTrainedTokenizerBase, task: Task | str,
                  config: DecodingConfig | None = None, **options: Any) -> EvalResult:
    """Decode and grade ``limit`` examples of ``task`` (or the given ``examples``, from :func:`load_examples`)
    under one decoding setting: :func:`evaluate_settings` (which takes ``options``) with one setting."""
    return evaluate_settings(model, tokenizer, task, [config or DecodingConfig()], **options)[0]


def evaluate_settings(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    task: Task | str,
    configs: Sequence[DecodingConfig],
    limit: int | None = None,
    data_file: str | None = None,
    execute_code: bool = False,
    batch_size: int = 1,
    progress: bool = True,
    hooks: Sequence[DecodeHook] = (),
    model_name: str | None = None,
    prompt_format: PromptFormat | None = None,
    examples: Sequence[Example] | None = None,
    records_file: str | Path | None = None,
) -> list[EvalResult]:
    """One :class:`EvalResult` per decoding setting in ``configs``, on every process of the launch.

    The work is cut into units, one per setting and batch of ``batch_size`` consecutive problems (the batches of a
    one-process run, so records do not depend on the number of processes), and the units are shared across the
    processes of ``accelerate launch`` / ``torchrun`` by their cost (:func:`unit_costs`,
    :func:`trims_hf.distributed.my_share`). Each process decodes its units; the records are gathered, and the
    result is a one-process run's: the same records in problem order, accuracy, tokens per step and NFE from
    summed totals, and tokens per second over the decoding wall time (the slowest process's).

    Extra ``hooks`` (e.g. a ``TrajectoryRecorder``) see every batch this process decodes, with the examples' ids as
    sample ids. With ``records_file`` (JSONL), every graded sample is appended as its batch finishes (by each
    process to its own :func:`process_records_file`), samples already saved by a run with the same
    :func:`run_fingerprint` (and the same prompt and gold answer) are not decoded again, and Ctrl-C raises
    :class:`EvaluationInterrupted`; the result equals an uninterrupted run's (timings aside).
    """
    from .distributed import gather, my_share, process_state

    task = get_task(task) if isinstance(task, str) else task
    fmt = prompt_format or PromptFormat()
    started = time.perf_counter()
    if examples is None:
        examples = load_examples(task, data_file, limit, execute_code)
    else:
        check_task_inputs(task, None, execute_code)
    state = process_state(_model_device(model))
    name = model_name or _model_name(model)
    settings = ", ".join(decoding_setting(config) for config in configs)
    prompts = {e.id: task.prompt(e, tokenizer, fmt) for e in examples}
    texts = {e.id: task.build_prompt(e, tokenizer, fmt) for e in examples}
    batches = [examples[begin : begin + batch_size] for begin in range(0, len(examples), batch_size)]
    units = [(c, b) for c in range(len(configs)) for b in range(len(batches))]
    lengths = {e.id: len(tokenizer(texts[e.id], add_special_tokens=False)["input_ids"]) for e in examples}
    costs = unit_costs([[lengths[e.id] for e in batch] for batch in batches], [c.gen_length for c in configs])
    mine = my_share(costs, state)
    total = len(examples) * len(configs)
    records: dict[tuple[int, str], SampleRecord] = {}
    files: list[Path] = []
    if records_file is not None:
        records_file = Path(records_file)
        fingerprints = [run_fingerprint(model, name, task, tokenizer, c, fmt, batch_size) for c in configs]
        files = records_files(records_file)
        saved = _saved_records(files, set(fingerprints))
        records = {(c, e.id): record for c, fingerprint in enumerate(fingerprints) for e in examples
                   if (record := saved.get((fingerprint, e.id)))
                   and (record.prompt, record.reference) == (texts[e.id], task.reference(e))}
        own_file = process_records_file(records_file, state.process_index, state.num_processes)
        files = sorted({*files, *(process_records_file(records_file, k, state.num_processes)
                                  for k in range(state.num_processes))})
        shown = records_file if state.num_processes == 1 else _rank_file(records_file, "*")  # where they are saved
        if records and state.is_main_process:
            print(f"resuming: {len(records)} of {total} {task.name} problems done ({settings}; {shown})",
                  file=sys.stderr)
    state.wait_for_everyone()  # every process has read the saved records before any appends new ones
    resumed, appended = len(records), _AppendedLines(files)
    recorders = [TokensPerStepRecorder(tokenizer, task.stop_strings) for _ in configs]
    decode_seconds = [0.0] * len(configs)  # this process's share of each setting's decoding
    bar = tqdm(total=total, initial=resumed, desc=task.name, disable=not progress or not state.is_main_process)
    try:
        for unit in mine:
            c, b = units[unit]
            batch = [e for e in batches[b] if (c, e.id) not in records]
            if batch:
                graded = _decode_and_grade(model, tokenizer, task, configs[c], batch, prompts, texts, fmt,
                                           [recorders[c], *hooks], execute_code)
                if records_file is not None:
                    _append_records(own_file, fingerprints[c], graded)
                records.update(((c, r.prompt_id), r) for r in graded)
            decode_seconds[c] += sum(records[c, e.id].decode_time_s for e in batches[b])
            bar.update((resumed + appended() if files else len(records)) - bar.n)
    except KeyboardInterrupt:
        if records_file is None:
            raise
        raise EvaluationInterrupted(task.name, settings, resumed + appended(), total,
                                    shown) from None
    shares = gather(({(c, e.id): records[c, e.id] for c, b in map(units.__getitem__, mine) for e in batches[b]},
                     decode_seconds))
    bar.update(total - bar.n)
    bar.close()
    merged = {key: record for share, _ in shares for key, record in share.items()}
    results = []
    for c, config in enumerate(configs):
        samples = [merged[c, e.id] for e in examples]
        tokens, nfe = sum(r.generated_tokens for r in samples), sum(r.nfe for r in samples)
        non_eos, decode_time = sum(r.non_eos_tokens for r in samples), sum(r.decode_time_s for r in samples)
        results.append(EvalResult(
            model=name,
            task=task.name,
            accuracy=sum(r.correct for r in samples) / len(samples),
            **throughput(tokens, non_eos, nfe, max(seconds[c] for _, seconds in shares)),
            nfe=nfe,
            generated_tokens=tokens,
            non_eos_tokens=non_eos,
            num_samples=len(samples),
            decode_time_s=decode_time,
            wall_time_s=time.perf_counter() - started,
            early_stop=config.early_stop,
            prompt_format={**task.prompt_format(tokenizer), "template": resolved_format(tokenizer, fmt),
                           "system_prompt": fmt.system_prompt},
            decoding=asdict(config),
            num_processes=state.num_processes,
            samples=samples,
        ))
    return results


def _decode_and_grade(model: nn.Module, tokenizer: PreTrainedTokenizerBase, task: Task, config: DecodingConfig,
                      batch: Sequence[Example], prompts: dict[str, Any], texts: dict[str, str], fmt: PromptFormat,
                      hooks: Sequence[DecodeHook], execute_code: bool) -> list[SampleRecord]:
    """Decode one batch (``hooks[0]`` is the setting's :class:`TokensPerStepRecorder`) and grade every answer."""
    recorder = hooks[0]
    decoding_before = recorder.wall_time_s
    completions = generate_text(model, tokenizer, [prompts[e.id] for e in batch], config, hooks,
                                [e.id for e in batch], fmt, task.stop_strings)
    share = (recorder.wall_time_s - decoding_before) / len(batch)
    graded = []
    for example, completion in zip(batch, completions):
        grade = task.grade(example, completion, execute_code=execute_code)
        counts = recorder.samples[example.id]
        graded.append(SampleRecord(
            prompt_id=example.id, prompt=texts[example.id], reference=task.reference(example),
            completion=completion, extracted=grade["extracted"], correct=bool(grade["correct"]),
            error=grade["error"], generated_tokens=counts["tokens"], non_eos_tokens=counts["non_eos_tokens"],
            nfe=counts["nfe"], decode_time_s=share, isolation=grade.get("isolation"),
        ))
    return graded


def sweep_configs(config: DecodingConfig, values: Sequence[float]) -> list[DecodingConfig]:
    """``config`` once per value of its strategy's knob (:data:`SWEEP_PARAMETER`), each validated."""
    parameter = SWEEP_PARAMETER[config.strategy]
    if parameter == "steps" and (fractional := [v for v in values if v != int(v)]):
        raise ValueError(f"{config.strategy} sweeps steps, whole numbers; got {fractional[0]}.")
    return [replace(config, **{parameter: int(v) if parameter == "steps" else float(v)}) for v in values]


def sweep(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    task: Task | str,
    values: Sequence[float],
    config: DecodingConfig | None = None,
    **kwargs: Any,
) -> list[EvalResult]:
    """:func:`evaluate_settings` over the values of the strategy's knob (threshold tau by default), for a frontier."""
    return evaluate_settings(model, tokenizer, task, sweep_configs(config or DecodingConfig(), values), **kwargs)


AUP_DEFINITION = (f"d3LLM's accuracy under parallelism (trims_hf.aup) over (tokens_per_step, accuracy in percent) of "
                  f"each model's settings on a task: alpha {ALPHA:g}, points more than {Y_MIN_OFFSET:g} accuracy points "
                  "below the lowest-parallelism one left out, y_max the best accuracy on the task among the rows shown")
"""What the ``aup`` rows of a results file and the AUP table measure."""


def aup_rows(results: Sequence[EvalResult], published: Sequence[PublishedResult] = ()) -> list[dict[str, Any]]:
    """AUP of each model's curve on each task (a sweep's settings; one result scores tokens/step x accuracy),
    published rows included, all of a task weighted by the same ``y_max`` as d3LLM's leaderboard weights them.
    ``aup`` is None for a curve AUP cannot score: a point at 0 tokens per step (AUP needs parallelism > 0), or a
    number that is not one (NaN, which the results file then refuses)."""
    shown = [*results, *published]
    rows = []
    for task in dict.fromkeys(r.task for r in results):
        in_task = [r for r in shown if r.task == task]
        y_max = max(100 * r.accuracy for r in in_task)
        for model in dict.fromkeys(r.model for r in in_task):
            points = [(r.tokens_per_step, 100 * r.accuracy) for r in in_task if r.model == model]
            scorable = all(0 < rho < math.inf and 0 <= y <= 100 for rho, y in points)
            value = accuracy_under_parallelism(points, y_max) if scorable else None
            rows.append({"model": model, "task": task, "aup": value, "y_max": y_max, "points": len(points)})
    return rows


def save_results(results: Sequence[EvalResult], path: str | Path,
                 published: Sequence[PublishedResult] = ()) -> Path:
    """Write ``{"units": ..., "results": [...], "aup": ...}`` (one schema for one result or a sweep) in one atomic
    step, so an interrupted write never leaves a half file, and as strict JSON (no NaN or Infinity). ``aup`` holds
    :func:`aup_rows` (with the ``published`` rows the table showed, so the file's numbers are the table's)."""
    aup = {"definition": AUP_DEFINITION, "rows": aup_rows(results, published)}
    return write_json(Path(path), {"units": RESULT_UNITS, "results": [r.to_dict() for r in results], "aup": aup})


def _sample_counts(results: Sequence[EvalResult]) -> str:
    """``n=100``, or ``n=50-100`` when the results were graded on different numbers of samples."""
    low, high = min(r.num_samples for r in results), max(r.num_samples for r in results)
    return f"n={low}" if low == high else f"n={low}-{high}"


def format_table(results: Sequence[EvalResult], published: Sequence[PublishedResult] = ()) -> str:
    """Markdown table like the paper's Tables 1-2: a row per model and setting, accuracy (%, with n) and
    tokens per step per task, then the ``published`` rows of those tasks (setting ``published``); below it the
    AUP of each model per task (:func:`aup_rows`)."""
    tasks = list(dict.fromkeys(r.task for r in results))
    rows: dict[tuple[str, str], dict[str, EvalResult]] = {}
    for result in results:
        rows.setdefault((result.model, result.setting), {})[result.task] = result
    uniform = {task: len({r.num_samples for r in results if r.task == task}) == 1 for task in tasks}
    header = ["Model", "Setting"]
    for task in tasks:
        n = f", {_sample_counts([r for r in results if r.task == task])}" if uniform[task] else ""
        header += [f"{task} Acc (%{n})", f"{task} Tokens/step"]
    body = []
    for (model, setting), by_task in rows.items():
        cells = [model, setting]
        for task in tasks:
            result = by_task.get(task)
            if result is None:
                cells += ["-", "-"]
                continue
            n = "" if uniform[task] else f" (n={result.num_samples})"
            cells += [f"{100 * result.accuracy:.1f}{n}", f"{result.tokens_per_step:.2f}"]
        body.append(cells)
    shown = [p for p in published if p.task in tasks]
    for model in dict.fromkeys(p.model for p in shown):
        by_task = {p.task: p for p in shown if p.model == model}
        body.append([model, "published"] + [cell for task in tasks for cell in (
            (f"{100 * by_task[task].accuracy:.1f}", f"{by_task[task].tokens_per_step:.2f}") if task in by_task
            else ("-", "-"))])
    early_stop = ", ".join(sorted({"on" if r.early_stop else "off" for r in results}))
    aup = aup_rows(results, shown)
    y_max = {row["task"]: row["y_max"] for row in aup}
    aup_body = [[model] + ["-" if row is None or row["aup"] is None else f"{row['aup']:.1f}"
                           for row in (next((r for r in aup if r["model"] == model and r["task"] == task), None)
                                       for task in tasks)]
                for model in dict.fromkeys(row["model"] for row in aup)]
    aup_table = markdown_table(["Model"] + [f"{task} AUP (y_max {y_max[task]:.1f})" for task in tasks], aup_body)
    published_note = (" Published rows: accuracy (%) and tokens per step as printed, measured with their paper's "
                      "protocol; one point each, so their AUP is tokens/step x accuracy.") if shown else ""
    return (markdown_table(header, body) + "\n\nAcc: percent of the n problems graded correct. Tokens/step: generated "
            f"tokens (no EOS, nothing after stop strings) per forward, ratio of totals; early stop: {early_stop}."
            f"{published_note}\n\n{aup_table}\n\nAUP: {AUP_DEFINITION}.")


def _label_slots() -> list[tuple[float, float, str, str]]:
    """Where a point's label may sit, in points from its marker, nearest first: above, right, below, left, then
    the diagonals, then the same further out (a crowded cluster stacks its labels)."""
    slots = []
    for distance in (5, 13, 21, 29, 37):
        slots += [(0, distance, "center", "bottom"), (distance, 0, "left", "center"), (0, -distance, "center", "top"),
                  (-distance, 0, "right", "center"), (distance * 0.8, distance * 0.8, "left", "bottom"),
                  (-distance * 0.8, distance * 0.8, "right", "bottom"), (distance * 0.8, -distance * 0.8, "left", "top"),
                  (-distance * 0.8, -distance * 0.8, "right", "top")]
    return slots


def _place_labels(axis: Any, points: Sequence[tuple[float, float, str, str]], renderer: Any) -> None:
    """Label every point at the first slot that stays inside the axes and overlaps no marker or earlier label
    (else the slot with the fewest overlaps), so labels neither collide nor get clipped; a label moved away from
    its marker gets a thin leader line."""
    frame = axis.get_window_extent(renderer)
    radius = 3.5 * axis.figure.dpi / 72  # the 6-point marker, plus a little air
    taken = [Bbox.from_extents(px - radius, py - radius, px + radius, py + radius)
             for px, py in axis.transData.transform([(x, y) for x, y, _, _ in points])]
    for x, y, text, color in points:
        best: tuple[tuple[bool, int], Any, Bbox] | None = None
        for dx, dy, ha, va in _label_slots():
            leader = {"arrowprops": {"arrowstyle": "-", "color": color, "lw": 0.5}} if max(abs(dx), abs(dy)) > 5 else {}
            label = axis.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                                  fontsize=7, color=color, annotation_clip=False, **leader)
            label.update_positions(renderer)
            box = Text.get_window_extent(label, renderer)  # the text alone, without its leader line
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            score = (not inside, sum(box.overlaps(other) for other in taken))
            if best is None or score < best[0]:
                if best is not None:
                    best[1].remove()
                best = (score, label, box)
            else:
                label.remove()
            if score == (False, 0):
                break
        taken.append(best[2])


def plot_frontier(results: Sequence[EvalResult], path: str | Path | None = None,
                  published: Sequence[PublishedResult] = ()) -> Figure:
    """Accuracy (%) against tokens per step, one panel per task (n in its title) and one line per model (the
    paper's Figures 3-4); each point is labelled with its swept value. Each ``published`` row of a panel's task
    is one square marker labelled with its method, its legend entry naming the source."""
    tasks = list(dict.fromkeys(r.task for r in results))
    shown = [p for p in published if p.task in tasks]
    models = list(dict.fromkeys(r.model for r in [*results, *shown]))  # one colour per model across panels
    # The object-oriented Figure API draws without pyplot, so the user's matplotlib backend is left alone.
    figure = Figure(figsize=(4.5 * len(tasks), 3.8), layout="constrained")
    renderer = FigureCanvasAgg(figure).get_renderer()
    axes = figure.subplots(1, len(tasks), squeeze=False)[0]
    labels: dict[Any, list[tuple[float, float, str, str]]] = {}
    for axis, task in zip(axes, tasks):
        in_task = [r for r in results if r.task == task]
        for model in dict.fromkeys(r.model for r in in_task):
            points = sorted((r for r in in_task if r.model == model), key=lambda r: r.tokens_per_step)
            color = f"C{models.index(model) % 10}"
            # clip_on=False: a marker at 0 % or 100 % is drawn whole on the frame instead of cut in half.
            axis.plot([r.tokens_per_step for r in points], [100 * r.accuracy for r in points], marker="o",
                      label=model, color=color, clip_on=False)
            labels.setdefault(axis, []).extend(
                (r.tokens_per_step, 100 * r.accuracy, r.setting.split()[-1], color) for r in points)
        for row in (p for p in shown if p.task == task):
            color = f"C{models.index(row.model) % 10}"
            axis.plot([row.tokens_per_step], [100 * row.accuracy], marker="s", linestyle="none", label=row.model,
                      color=color, clip_on=False)
            labels.setdefault(axis, []).append((row.tokens_per_step, 100 * row.accuracy, row.method, color))
        top = max(100 * r.accuracy for r in [*in_task, *shown] if r.task == task)
        axis.set_ylim(0, min(100.0, max(10.0, 1.25 * top)))  # accuracy lives in [0, 100]
        axis.margins(x=0.12)
        axis.set(title=f"{task} ({_sample_counts(in_task)})", xlabel="tokens per step", ylabel="accuracy (%)")
        axis.grid(alpha=0.3)
    # One legend below the panels: model names (paths, adapters) are often longer than a panel is wide.
    legend = {label: handle for axis in axes for handle, label in zip(*axis.get_legend_handles_labels())}
    parameter = SWEEP_PARAMETER[results[0].decoding["strategy"]]
    figure.legend(legend.values(), legend.keys(), loc="outside lower center", fontsize=8,
                  title=f"point labels: {parameter}" + ("; squares: published, labelled by method" if shown else ""),
                  title_fontsize=8)
    figure.draw_without_rendering()  # settle the layout, then place labels in their final pixel positions
    for axis, points in labels.items():
        _place_labels(axis, points, renderer)
    figure.set_layout_engine("none")  # keep the settled layout: the labels were placed for it
    if path is not None:
        figure.savefig(path, bbox_inches="tight", dpi=120)
    return figure
