"""Benchmark evaluation of a student: accuracy and decoding parallelism, threshold sweeps (their files, tables and
plots: :mod:`trims_hf.evaluation.results`).

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
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ..generation import (
    DecodeHook,
    DecodingConfig,
    TokensPerStepRecorder,
    generate_text,
    throughput,
)
from ..generation.decoding import past_the_positions
from ..prompts import prompt_token_ids, resolved_format
from ..reports import library_versions, weights_fingerprint
from ..settings import PromptFormat, settings_record
from ..students import has_compiled_blocks
from .tasks import (
    CodeExecutionDisabled,
    CodeTask,
    Example,
    Task,
    TaskDataError,
    get_task,
)

# The knob each decoding strategy is swept over.
SWEEP_PARAMETER = {"threshold": "threshold", "entropy": "entropy_threshold", "factor": "factor", "fixed_steps": "steps",
                   "threshold_quota": "threshold"}

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


def longest_prompt_past(positions: int | None, task: Task, examples: Sequence[Example],
                        tokenizer: PreTrainedTokenizerBase, gen_length: int,
                        prompt_format: PromptFormat | None = None) -> str | None:
    """Why the longest prompt of ``examples``, as the decoder renders it, plus ``gen_length`` tokens does not fit a
    student of ``positions`` positions (naming its problem), or None when every one fits: checked before a model
    loads, or before a training run whose evaluation would reach it."""
    if positions is None or not examples:
        return None
    fmt = prompt_format or PromptFormat()
    length, example = max((len(prompt_token_ids(tokenizer, task.prompt(e, tokenizer, fmt), fmt)), e.id) for e in examples)
    problem = past_the_positions(positions, length, gen_length)
    return None if problem is None else f"problem {example}: {problem}"


def _model_name(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__


def run_fingerprint(model: nn.Module, model_name: str, task: Task, tokenizer: PreTrainedTokenizerBase,
                    config: DecodingConfig, prompt_format: PromptFormat, batch_size: int) -> str:
    """A short hash of everything that decides a sample's record: the model's name, its weights
    (:func:`~trims_hf.reports.weights_fingerprint`: a retrained adapter in the same folder differs), dtype and device,
    the task and prompt format, the decoding settings, the batch size (left padding moves the numerics) and whether
    the model runs compiled blocks. Records of another fingerprint are never reused."""
    parameters = list(model.parameters())
    key = {
        "model": model_name, "weights": weights_fingerprint(model),
        "dtype": str(parameters[0].dtype) if parameters else None,
        "device": parameters[0].device.type if parameters else None,
        "task": task.prompt_format(tokenizer), "prompt_format": asdict(prompt_format), "decoding": settings_record(config),
        "batch_size": batch_size,
    }
    if has_compiled_blocks(model):  # compiled by an earlier call or by training: its kernels round differently
        key["compiled_blocks"] = True
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
    :func:`run_fingerprint` (and the same prompt and gold answer) are not decoded again (their completions are graded
    again), and Ctrl-C raises
    :class:`EvaluationInterrupted`; the result equals an uninterrupted run's (timings aside).
    """
    from ..distributed import gather, my_share, process_state

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
    saved = _Resume.read(records_file, state, [run_fingerprint(model, name, task, tokenizer, c, fmt, batch_size)
                                               for c in configs], examples, task, texts)
    records, files = saved.records, saved.files
    if records and state.is_main_process:
        print(f"resuming: {len(records)} of {total} {task.name} problems done ({settings}; {saved.shown})",
              file=sys.stderr)
    state.wait_for_everyone()  # every process has read the saved records before any appends new ones
    resumed, appended, regrade = len(records), _AppendedLines(files), set(records)
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
                    _append_records(saved.own_file, saved.fingerprints[c], graded)
                records.update(((c, r.prompt_id), r) for r in graded)
            records.update(((c, e.id), _graded_again(task, e, records[c, e.id], execute_code))
                           for e in batches[b] if (c, e.id) in regrade)
            decode_seconds[c] += sum(records[c, e.id].decode_time_s for e in batches[b])
            bar.update((resumed + appended() if files else len(records)) - bar.n)
    except KeyboardInterrupt:
        if records_file is None:
            raise
        raise EvaluationInterrupted(task.name, settings, resumed + appended(), total, saved.shown) from None
    shares = gather(({(c, e.id): records[c, e.id] for c, b in map(units.__getitem__, mine) for e in batches[b]},
                     decode_seconds))
    bar.update(total - bar.n)
    bar.close()
    merged = {key: record for share, _ in shares for key, record in share.items()}
    return [_result(name, task, tokenizer, fmt, config, [merged[c, e.id] for e in examples],
                    max(seconds[c] for _, seconds in shares), started, state.num_processes)
            for c, config in enumerate(configs)]


class _Resume(NamedTuple):
    """What an evaluation with a records file starts from: the records saved by a run of the same
    :func:`run_fingerprint` (per setting) for the same prompts and gold answers, every process's records file, the
    one this process appends to, and how the files are named to the user."""

    records: dict[tuple[int, str], SampleRecord]
    fingerprints: list[str]
    files: list[Path]
    own_file: Path | None
    shown: Path | None

    @classmethod
    def read(cls, records_file: str | Path | None, state: Any, fingerprints: list[str], examples: Sequence[Example],
             task: Task, texts: dict[str, str]) -> _Resume:
        if records_file is None:
            return cls({}, fingerprints, [], None, None)
        records_file = Path(records_file)
        files = records_files(records_file)
        saved = _saved_records(files, set(fingerprints))
        records = {(c, e.id): record for c, fingerprint in enumerate(fingerprints) for e in examples
                   if (record := saved.get((fingerprint, e.id)))
                   and (record.prompt, record.reference) == (texts[e.id], task.reference(e))}
        files = sorted({*files, *(process_records_file(records_file, k, state.num_processes)
                                  for k in range(state.num_processes))})
        shown = records_file if state.num_processes == 1 else _rank_file(records_file, "*")  # where they are saved
        return cls(records, fingerprints, files, process_records_file(records_file, state.process_index,
                                                                      state.num_processes), shown)


def _result(name: str, task: Task, tokenizer: PreTrainedTokenizerBase, fmt: PromptFormat, config: DecodingConfig,
            samples: list[SampleRecord], decode_wall_s: float, started: float, num_processes: int) -> EvalResult:
    """One setting's result from its records in problem order: accuracy, tokens per step and NFE from summed totals,
    tokens per second over ``decode_wall_s`` (the slowest process's decoding)."""
    tokens, nfe = sum(r.generated_tokens for r in samples), sum(r.nfe for r in samples)
    non_eos, decode_time = sum(r.non_eos_tokens for r in samples), sum(r.decode_time_s for r in samples)
    return EvalResult(
        model=name,
        task=task.name,
        accuracy=sum(r.correct for r in samples) / len(samples),
        **throughput(tokens, non_eos, nfe, decode_wall_s),
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
        num_processes=num_processes,
        samples=samples,
    )


def _graded_again(task: Task, example: Example, record: SampleRecord, execute_code: bool) -> SampleRecord:
    """A saved record with its completion graded by today's grader: decoding is what a resumed run saves, and a
    verdict saved by an earlier grader (or under another code isolation) is not reused."""
    grade = task.grade(example, record.completion, execute_code=execute_code)
    return replace(record, extracted=grade["extracted"], correct=bool(grade["correct"]), error=grade["error"],
                   isolation=grade.get("isolation"))


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
    """``config`` once per value of its strategy's knob (:data:`SWEEP_PARAMETER`), each validated; a value given twice
    is refused, as it would decode the same setting twice."""
    parameter = SWEEP_PARAMETER[config.strategy]
    if parameter == "steps" and (fractional := [v for v in values if v != int(v)]):
        raise ValueError(f"{config.strategy} sweeps steps, whole numbers; got {fractional[0]}.")
    if repeated := [v for index, v in enumerate(values) if v in values[:index]]:
        raise ValueError(f"{repeated[0]:g} is given twice; each value is one setting to decode.")
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


def gather_recorders(recorders: dict[str, TokensPerStepRecorder]) -> dict[str, TokensPerStepRecorder]:
    """Per task, one recorder holding every process's samples (keyed by process and sample id) and forwards, and the
    slowest process's decoding time: its summary is a one-process run's (tokens per second aside). Every process
    calls it (a process may lack a task that others decoded)."""
    from ..distributed import gather

    shares = gather({task: (r.samples, r.model_forwards, r.wall_time_s, r.early_stop) for task, r in recorders.items()})
    merged = {}
    for task in dict.fromkeys(task for share in shares for task in share):
        recorder = merged[task] = TokensPerStepRecorder()
        for process, share in enumerate(shares):
            if task not in share:
                continue
            samples, forwards, seconds, recorder.early_stop = share[task]
            recorder.samples.update(((process, key), counts) for key, counts in samples.items())
            recorder.model_forwards += forwards
            recorder.wall_time_s = max(recorder.wall_time_s, seconds)
    return merged
