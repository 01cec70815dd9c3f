"""The steps of a TRIMS study, shared by ``trims demo`` and ``recipes/smollm2``: an autoregressive SFT of the
teacher, MDLM / TRIMS training of a student, threshold evaluation with decode-order traces, the reports, and the
bookkeeping of a pre-registered study (protocol fingerprint, resumable units of work, a time budget).

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import torch
from datasets import Dataset
from transformers import (
    DataCollatorForSeq2Seq,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
)

from .analysis import TeacherNLL, format_study, hard_first_correlation, study_rows
from .config import MDLMConfig
from .evaluation import EvalResult, format_table, plot_frontier
from .generation import TrajectoryRecorder, teacher_nll_per_step
from .generation.plots import mean_curve, plot_decode_order, plot_teacher_nll
from .preparation import tokenize_example
from .reports import write_atomic
from .trainer import MDLMTrainer

# name -> (TRIMS trajectory ratio, bucket ordering); the MDLM baseline uses the same collator with ratio 0.
VARIANTS: dict[str, tuple[float, str]] = {
    "MDLM": (0.0, "hard_to_easy"),
    "TRIMS hard-to-easy": (0.1, "hard_to_easy"),
    "TRIMS easy-to-hard": (0.1, "easy_to_hard"),
    "TRIMS random": (0.1, "random"),
}
BASE = "base (before SFT)"


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


Protocol = TypeVar("Protocol")


def protocol_record(protocol: Any) -> dict[str, Any]:
    """Every field of a (dataclass) protocol, plus what its ``resolved()`` returns when it has one (the library
    defaults the settings resolve to), so that a changed library default is a changed protocol too."""
    record = json.loads(json.dumps(dataclasses.asdict(protocol)))
    if callable(resolved := getattr(protocol, "resolved", None)):
        record.update({f"resolved.{k}": v for k, v in json.loads(json.dumps(resolved(), default=str)).items()})
    return record


def fingerprint(protocol: Any) -> str:
    """A short hash of :func:`protocol_record`: what each output of a study records."""
    return hashlib.sha256(json.dumps(protocol_record(protocol), sort_keys=True).encode()).hexdigest()[:12]


def with_overrides(protocol: Protocol, assignments: Sequence[str]) -> Protocol:
    """``protocol`` with ``FIELD=VALUE`` assignments applied (tuple fields comma-separated, each value of the type
    of the field's current value); ValueError names the assignment. The protocol's own checks run on the result."""
    types = {f.name: type(getattr(protocol, f.name)) for f in dataclasses.fields(protocol)}
    changes: dict[str, Any] = {}
    for assignment in assignments:
        name, sep, text = assignment.partition("=")
        if not sep or name not in types:
            raise ValueError(f"{assignment}: expected FIELD=VALUE with FIELD one of {', '.join(types)}.")
        try:
            if types[name] is tuple:
                element = type(getattr(protocol, name)[0])
                changes[name] = tuple(element(part) for part in text.split(","))
            else:
                changes[name] = types[name](text)
        except ValueError:
            raise ValueError(f"{assignment}: {text!r} is not a valid {types[name].__name__}.") from None
    return dataclasses.replace(protocol, **changes)


PROTOCOL_FILE = "protocol.json"


def check_protocol(folder: Path, protocol: Any) -> None:
    """Refuse a study folder started under another protocol, naming each changed field (nothing is written):
    a pre-registered protocol is never mixed with a changed one, so a change is a new study in a new folder."""
    path = folder / PROTOCOL_FILE
    if not path.is_file():
        return
    recorded = json.loads(path.read_text())
    if recorded["fingerprint"] == fingerprint(protocol):
        return
    now = protocol_record(protocol)
    changed = [f"{k} ({recorded['protocol'].get(k)} -> {now[k]})" for k in now if recorded["protocol"].get(k) != now[k]]
    raise ValueError(f"holds the study of protocol {recorded['fingerprint']}; this protocol ({fingerprint(protocol)}) "
                     f"differs in {', '.join(changed)}. A changed protocol is a new study: use a new folder.")


def record_protocol(folder: Path, protocol: Any, sources: Mapping[str, str] | None = None) -> None:
    """Write the protocol, its fingerprint and the ``sources`` it ran on (e.g. a weights file's sha256) into the
    study folder (what :func:`check_protocol` and :func:`changed_sources` compare with)."""
    write_atomic(folder / PROTOCOL_FILE, json.dumps({"fingerprint": fingerprint(protocol),
                                                     "protocol": protocol_record(protocol),
                                                     "sources": dict(sources or {})}, indent=1))


def changed_sources(folder: Path, sources: Mapping[str, str]) -> list[str]:
    """``name (recorded -> now)`` of each source that differs from the one the study in ``folder`` started on:
    the same protocol on other weights is another study too."""
    path = folder / PROTOCOL_FILE
    recorded = json.loads(path.read_text()).get("sources", {}) if path.is_file() else {}
    return [f"{k} ({recorded[k]} -> {v})" for k, v in sources.items() if k in recorded and recorded[k] != v]


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


TRAINING_DEFAULTS: dict[str, Any] = {"lr_scheduler_type": "cosine", "warmup_steps": 0.05, "weight_decay": 0.1}
"""The optimisation settings every study run shares (a study's protocol fingerprint records them)."""


def training_arguments(cls: type[TrainingArguments], folder: Path, steps: int, lr: float, batch_size: int, seed: int,
                       use_cpu: bool = True, **extra: Any) -> TrainingArguments:
    """The study's training settings: cosine schedule, short warmup, no checkpoints (the callers save)."""
    return cls(
        output_dir=str(folder), max_steps=steps, per_device_train_batch_size=batch_size, learning_rate=lr,
        **TRAINING_DEFAULTS, logging_steps=max(1, steps // 5),
        save_strategy="no", report_to="none", use_cpu=use_cpu, seed=seed, disable_tqdm=False,
        remove_unused_columns=False, dataloader_num_workers=0, **extra,
    )


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
