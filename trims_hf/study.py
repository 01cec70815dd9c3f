"""The steps of a TRIMS study, shared by ``trims demo`` and ``recipes/smollm2``: the protocol every study declares
(:class:`StudyProtocol`), an autoregressive SFT of the teacher, scoring, MDLM / TRIMS training of a student, threshold
evaluation with decode-order traces, the reports, and the bookkeeping of a pre-registered study (protocol
fingerprint, resumable units of work, a time budget).

A study compares the MDLM baseline with the three TRIMS orderings (:data:`VARIANTS`), each continued from one
base with the same steps, data order and seed, so they differ only by their masking. The callers decide what is
cached and where; these functions only train, measure and write.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from datasets import Dataset
from transformers import (
    DataCollatorForSeq2Seq,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
)

from .analysis import TeacherNLL, format_study, hard_first_correlation, study_rows
from .config import MDLMConfig
from .evaluation import EvalResult, evaluate_task, format_table, plot_frontier
from .generation import TrajectoryRecorder, teacher_nll_per_step
from .generation.plots import mean_curve, plot_decode_order, plot_teacher_nll
from .jobs.score import build_scored_dataset
from .preparation import prepare_dataset, tokenize_example
from .protocol import StudyProtocol
from .reports import write_atomic
from .tasks.base import Task
from .trainer import MDLMTrainer


def slug(name: str) -> str:
    """A file-name form of a model name (``TRIMS hard-to-easy`` -> ``trims_hard_to_easy``)."""
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


KEY_FILE = "cache-key.json"


def cached(folder: Path, key: Mapping[str, Any]) -> bool:
    """True when ``folder`` holds a complete artefact built with exactly ``key`` (its key file is written last)."""
    path = folder / KEY_FILE
    return path.is_file() and json.loads(path.read_text()) == json.loads(json.dumps(key))


def mark_cached(folder: Path, key: Mapping[str, Any]) -> None:
    """Mark ``folder`` complete for ``key``; call it after everything else in the folder is written."""
    write_atomic(folder / KEY_FILE, json.dumps(key, indent=2))


class OutOfBudget(Exception):
    """A study's time budget ran out between two units of work; running it again continues."""


@dataclasses.dataclass
class Units:
    """Resumable units of work of one study: each unit is a folder, finished when its key file names the unit and
    the protocol's fingerprint (written last, after ``unit.json`` with its wall time and measurements). A unit
    cut short is started over; no unit starts after ``deadline`` (``time.monotonic()``)."""

    protocol_fingerprint: str
    device: str
    deadline: float = math.inf
    ran: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)

    def key(self, name: str) -> dict[str, str]:
        return {"unit": name, "protocol": self.protocol_fingerprint}

    def finished(self, folder: Path, name: str) -> bool:
        return cached(folder, self.key(name))

    def unit(self, folder: Path, name: str, timed: bool = True, expected_s: float = 0.0) -> bool:
        """True when ``folder`` must be (re)built now (it is then empty); raises :class:`OutOfBudget` unless not
        ``timed`` when the unit, taking ``expected_s``, would end past the deadline: a unit killed by the caller's
        own time limit is lost, one not started is only postponed."""
        if self.finished(folder, name):
            self.skipped.append(name)
            return False
        if timed and time.monotonic() + expected_s > self.deadline:
            raise OutOfBudget(f"{name} (expected {expected_s:.0f} s)" if expected_s else name)
        print(f"\n== {name} ==", flush=True)
        self.ran.append(name)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return True

    def done(self, folder: Path, name: str, started: float, info: Mapping[str, Any] | None = None) -> None:
        """Record what the unit measured and its wall time since ``started`` (``time.perf_counter()``), then mark
        it finished."""
        record = {"unit": name, "protocol": self.protocol_fingerprint, "device": self.device,
                  "wall_s": round(time.perf_counter() - started, 2), **(info or {})}
        write_atomic(folder / "unit.json", json.dumps(record, indent=1, default=str))
        mark_cached(folder, self.key(name))


# -- the stages shared by every study ---------------------------------------------------------------------------------
def tiny_llama(tokenizer: PreTrainedTokenizerBase, hidden_size: int, num_layers: int, num_heads: int,
               max_length: int, seed: int) -> LlamaForCausalLM:
    """A small Llama (rotary positions, like LLaDA): a teacher as is, a student once made bidirectional."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=2 * max_length, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def score_rows(protocol: StudyProtocol, rows: Sequence[Mapping[str, str]], folder: Path,
               teacher: tuple[PreTrainedModel, PreTrainedTokenizerBase], teacher_name: str, source: str) -> None:
    """Teacher NLL and entropy of every completion token through ``trims score``'s code path, into ``folder``."""
    build_scored_dataset(Dataset.from_list(list(rows)), folder, teacher=teacher_name, loaded_teacher=teacher,
                         buckets=protocol.bucket_config(), options=protocol.scoring_options(), source=source,
                         overwrite=True)


def prepared_rows(protocol: StudyProtocol, scored: Dataset, tokenizer: PreTrainedTokenizerBase,
                  ordering: str) -> Dataset:
    """The scored rows prepared for the student with the protocol's buckets in ``ordering``."""
    return prepare_dataset(scored, tokenizer, protocol.student_format, protocol.bucket_config(ordering))


class TraceMetrics(NamedTuple):
    """What the traces of one model give: the per-step teacher NLL curve, the mean hard-first correlation, and
    how many problems were traced and how many of them gave a correlation (the mean is over those)."""

    curve: list[float | None]
    hard_first: float | None
    traced: int
    correlated: int


def trace_metrics(recorder: TrajectoryRecorder, prompts: Mapping[str, str], tokenizer: PreTrainedTokenizerBase,
                  teacher: tuple[PreTrainedModel, PreTrainedTokenizerBase], samples: int, max_length: int,
                  block_length: int) -> TraceMetrics:
    """The per-step teacher NLL curve (Figure 7; mean over the first ``samples`` traced problems, None where no
    problem reaches that step) and the mean :func:`~trims_hf.analysis.hard_first_correlation` of one model.

    Every partial response of every traced problem is scored up front in padded teacher batches
    (:class:`~trims_hf.analysis.TeacherNLL`), not one teacher forward per decoding step.
    """
    trajectories = recorder.trajectories[:samples]
    scores = TeacherNLL(*teacher, tokenizer, max_length)
    scores.prefetch([(prompts[t.sample_id], t.partial_response(step)) for t in trajectories
                     for step in range(int(t.commit_step.max()) + 1)])
    scorers = [(t, scores.scorer(prompts[t.sample_id])) for t in trajectories]
    curve = [None if math.isnan(v) else float(v)
             for v in mean_curve([teacher_nll_per_step(t, score) for t, score in scorers])]
    correlations = [c for t, score in scorers if not math.isnan(c := hard_first_correlation(t, score, block_length))]
    return TraceMetrics(curve, statistics.fmean(correlations) if correlations else None, len(trajectories),
                        len(correlations))


def plot_trace_order(recorder: TrajectoryRecorder, samples: int, path: Path, title: str) -> None:
    """The decode-order picture of the first ``samples`` traced problems."""
    steps, filled = recorder.decode_order()
    plot_decode_order(steps[:samples], filled[:samples], path, title=title)


class Evaluation(NamedTuple):
    """One model at one threshold: its result, and its traces when the trace policy takes them."""

    result: EvalResult
    trace: TraceMetrics | None


def evaluate_at(protocol: StudyProtocol, name: str, seed: int | None, model: PreTrainedModel,
                tokenizer: PreTrainedTokenizerBase, task: Task, tau: float, batch_size: int,
                teacher: Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase]], prompts: Mapping[str, str],
                plot: Path, records_file: Path | None = None) -> Evaluation:
    """Accuracy and tokens per step of one model at ``tau``; when :meth:`StudyProtocol.traced`, also its decode order
    (plotted to ``plot``), per-step teacher NLL and hard-first correlation. ``teacher`` is called only then. A traced
    evaluation decodes every problem afresh (resumed records would leave gaps in the traces), so ``records_file``
    serves the others only."""
    traced = protocol.traced(tau, seed)
    recorder = TrajectoryRecorder()
    result = evaluate_task(model, tokenizer, task, protocol.decoding_at(tau), batch_size=batch_size,
                           hooks=[recorder] if traced else [], model_name=name,
                           records_file=None if traced else records_file)
    metrics = None
    if traced:
        metrics = trace_metrics(recorder, prompts, tokenizer, teacher(), protocol.trace_samples,
                                protocol.teacher_context, protocol.decoding.block_length)
        plot_trace_order(recorder, protocol.trace_samples, plot, title=f"{name} (seed {seed}): decode order at tau {tau}")
    print(f"{name} (seed {seed}) tau {tau}: accuracy {result.accuracy:.3f}, tokens/step {result.tokens_per_step:.2f}",
          flush=True)
    return Evaluation(result, metrics)


def train_causal_lm(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[Mapping[str, str]],
                    args: TrainingArguments) -> PreTrainedModel:
    """Autoregressive SFT on ``prompt``/``completion`` rows, prompts rendered by the library's one renderer.

    The loss covers the completion and its end-of-response tokens only: the teacher models p(y | x), which is what
    its NLL scores measure. DataCollatorForSeq2Seq pads precomputed labels with -100 and ids with the pad token.
    """
    examples = [tokenize_example(tokenizer, row["prompt"], row["completion"]) for row in rows]
    prepared = Dataset.from_list([{"input_ids": e.input_ids,
                                   "labels": [-100] * e.prompt_length + list(e.input_ids[e.prompt_length :])}
                                  for e in examples])
    Trainer(model=model, args=args, train_dataset=prepared, data_collator=DataCollatorForSeq2Seq(tokenizer)).train()
    return model.eval()


def train_student(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, data: Dataset,
                  args: MDLMConfig, record: dict[str, Any] | None = None) -> PreTrainedModel:
    """MDLMTrainer with the collator it builds from ``args``: ``trajectory_ratio`` 0 is MDLM, otherwise TRIMS.

    With ``record``, ``record["first_batch"]`` gets a hash of the first training batch's token ids: runs that
    should share a data order (the variants of one seed) can then be checked to.
    """
    trainer = MDLMTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    if record is not None:
        collate = trainer.data_collator

        def recording(features: list[dict[str, Any]]) -> Any:
            record.setdefault("first_batch", hashlib.sha256(json.dumps([list(f["input_ids"]) for f in features])
                                                            .encode()).hexdigest()[:16])
            return collate(features)

        trainer.data_collator = recording
    trainer.train()
    return model.eval()


def write_study_reports(output: Path, results: Sequence[tuple[int | None, EvalResult]], seeds: Sequence[int],
                        nll_curves: Mapping[str, Sequence[float | None]], hard_first: Mapping[str, float | None],
                        trace_tau: float, trace_samples: int, payload: Mapping[str, Any],
                        results_name: str = "results.json", with_samples: bool = True,
                        baselines: Mapping[str, str] | None = None,
                        correlated: Mapping[str, tuple[int, int]] | None = None) -> dict[str, Path]:
    """``table.md`` (the first seed's table, then mean and spread over seeds), ``frontier.png`` (first seed),
    ``teacher_nll_per_step.png`` and ``results_name`` (``payload`` + every result + the study rows); returns paths.

    Every number comes from the evaluation records in ``results``; nothing is recomputed here. Without
    ``with_samples`` the per-problem records stay out of the JSON (a large study keeps them in its own files);
    ``baselines`` as in :func:`~trims_hf.analysis.study_rows`; ``correlated`` gives per model (problems with a
    correlation, problems traced), shown next to each mean since problems without one drop out of it.
    """
    first_seed = seeds[0]
    main = [r for s, r in results if s in (None, first_seed)]
    paths = {"table": output / "table.md", "frontier": output / "frontier.png", "json": output / results_name,
             "teacher_nll": output / "teacher_nll_per_step.png"}
    study = study_rows(results, baselines=baselines)
    table = format_table(main)
    if len(seeds) > 1:
        table += f"\n\nOver seeds {list(seeds)} (SFT seeds; teacher and base shared):\n\n" + format_study(study)
    counts = {name: f" ({n} of {of})" for name, (n, of) in (correlated or {}).items()}
    order = ", ".join(f"{name} {'-' if value is None else f'{value:+.2f}'}{counts.get(name, '')}"
                      for name, value in hard_first.items())
    table += (f"\n\nSpearman(teacher NLL of an answer token, steps into its block before it was committed) at tau "
              f"{trace_tau}, mean over {trace_samples} problems (negative: hard tokens first): {order}.")
    write_atomic(paths["table"], table + "\n")
    plot_frontier(main, paths["frontier"])
    curves = {name: [torch.tensor([math.nan if v is None else v for v in curve])] for name, curve in nll_curves.items()}
    plot_teacher_nll(curves, paths["teacher_nll"], title=f"Teacher NLL of the partial response, tau {trace_tau}")
    rows = [{"seed": seed, **{k: v for k, v in result.to_dict().items() if with_samples or k != "samples"}}
            for seed, result in results]
    document = {**payload, "results": rows, "study": study,
                "teacher_nll_per_step": dict(nll_curves), "nll_vs_decode_step_spearman": dict(hard_first)}
    write_atomic(paths["json"], json.dumps(document, indent=1, default=str))
    return paths
