"""The pieces every study's stages share, apart from the runner (:class:`~trims_hf.studies.study.Study`): teacher
scoring through ``trims score``'s code path, prepared rows, a student's training, decode-order traces and their
metrics, the report's table and results file, a result read back, and what the numbers ran on."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from datasets import Dataset
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..data.preparation import prepare_dataset
from ..data.score_job import build_scored_dataset
from ..evaluation.evaluate import EvalResult, SampleRecord
from ..evaluation.results import format_table, plot_frontier
from ..generation import TrajectoryRecorder, teacher_nll_per_step
from ..generation.plots import mean_curve, plot_decode_order, plot_teacher_nll
from ..reports import library_versions, write_atomic
from ..training.config import MDLMConfig
from ..training.trainer import MDLMTrainer
from .analysis import SPEARMAN_LABEL, TeacherNLL, format_study, hard_first_correlation, study_rows
from .protocol import TEACHER_CONTEXT_FACTOR, StudyProtocol


def score_rows(protocol: StudyProtocol, rows: Sequence[Mapping[str, str]], folder: Path,
               teacher: tuple[PreTrainedModel, PreTrainedTokenizerBase], teacher_name: str, source: str) -> None:
    """Teacher NLL and entropy of every completion token through ``trims score``'s code path, into ``folder``."""
    build_scored_dataset(Dataset.from_list(list(rows)), folder, teacher=teacher_name, loaded_teacher=teacher,
                         buckets=protocol.bucket_config(), options=protocol.scoring_options(), source=source,
                         overwrite=True)


def check_rows_fit(protocol: StudyProtocol, rows: Sequence[Mapping[str, str]], student: PreTrainedTokenizerBase,
                   teacher: PreTrainedTokenizerBase) -> None:
    """Refuse a ``student_format.max_length`` too short for the training rows, naming the least that fits them, before
    a pretrained model trains: scoring refuses a row longer than the teacher's context
    (:attr:`~trims_hf.studies.protocol.StudyProtocol.teacher_context`) and, cutting its buckets over the completion
    tokens within ``max_length`` teacher tokens, rows whose prompts all fill that; the base refuses a prompt that leaves
    the student no completion token; each only after the pretrained model trained. ``student`` and ``teacher``
    tokenize as each model reads."""
    from ..data.teacher import encode_row
    from ..errors import InputError
    from ..prompts import prompt_token_ids

    length, options = protocol.student_format.max_length, protocol.scoring_options()
    needs: list[tuple[int, str]] = []  # (the least max_length a rule asks for, why)
    prompts = []  # (teacher tokens of a row's prompt, row)
    for index, row in enumerate(rows):
        prompt = len(prompt_token_ids(student, row["prompt"], protocol.student_format))
        needs.append((prompt + 1, f"row {index}'s prompt is {prompt} student tokens, and a completion token must "
                                  "follow it"))
        encoded = encode_row(dict(row), index, teacher, options, sys.maxsize)
        needs.append((-(-len(encoded.input_ids) // TEACHER_CONTEXT_FACTOR),
                      f"row {index} is {len(encoded.input_ids)} teacher tokens, over the teacher's context of "
                      f"{TEACHER_CONTEXT_FACTOR} x student_format.max_length = {TEACHER_CONTEXT_FACTOR * length}"))
        prompts.append((encoded.prompt_length, index))
    if prompts and protocol.bucket_config().quantile_tokens == "kept":
        prompt, index = min(prompts)
        needs.append((prompt + 1, f"the shortest prompt, row {index}'s, is {prompt} teacher tokens, and the teacher's "
                                  "buckets are cut over the completion tokens within student_format.max_length teacher "
                                  "tokens"))
    least, why = max(needs, default=(0, ""))
    if least > length:
        raise InputError(f"student_format.max_length={length} is too short for the training rows: {why}; set it to "
                         f"at least {least}.")


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
    problem reaches that step) and the mean :func:`~trims_hf.studies.analysis.hard_first_correlation` of one model.

    Every partial response of every traced problem is scored up front in padded teacher batches
    (:class:`~trims_hf.studies.analysis.TeacherNLL`), not one teacher forward per decoding step.
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


@dataclasses.dataclass
class StudyReport:
    """What a study's report shows: every finished evaluation as (seed, result), the SFT ``seeds`` (the first one's
    table comes first), the traces' per-model teacher NLL ``curves``, ``hard_first`` means and ``correlated`` counts
    (problems with a correlation, problems traced), at ``trace_tau`` over ``trace_samples`` problems, the ``payload``
    results.json carries beside them, and ``notes`` put above the table (a partial run's)."""

    results: list[tuple[int | None, EvalResult]]
    seeds: Sequence[int]
    trace_tau: float
    trace_samples: int
    payload: Mapping[str, Any]
    curves: dict[str, list[float | None]] = dataclasses.field(default_factory=dict)
    hard_first: dict[str, float | None] = dataclasses.field(default_factory=dict)
    correlated: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def write(self, output: Path) -> Path:
        """``table.md`` (the notes, the first seed's table, then mean and spread over seeds), ``frontier.png`` (first
        seed), ``teacher_nll_per_step.png``, ``results.json`` (the payload, every result without its per-problem
        records, the study rows) and ``records.jsonl.gz`` (every graded problem); returns the table's path.

        Every number comes from the evaluation records in ``results``; nothing is recomputed here."""
        main = [r for s, r in self.results if s in (None, self.seeds[0])]
        study = study_rows(self.results)
        table = format_table(main)
        if len(self.seeds) > 1:
            table += f"\n\nOver seeds {list(self.seeds)} (SFT seeds; teacher and base shared):\n\n" + format_study(study)
        counts = {name: f" ({n} of {of})" for name, (n, of) in self.correlated.items()}
        order = ", ".join(f"{name} {'-' if value is None else f'{value:+.2f}'}{counts.get(name, '')}"
                          for name, value in self.hard_first.items())
        table += (f"\n\n{SPEARMAN_LABEL} at tau {self.trace_tau}, mean over the traced problems it is defined on "
                  f"(of how many, in brackets; negative: hard tokens first): {order}.")
        write_atomic(output / "table.md", "".join(note + "\n\n" for note in self.notes) + table + "\n")
        plot_frontier(main, output / "frontier.png")
        curves = {name: [torch.tensor([math.nan if v is None else v for v in curve])]
                  for name, curve in self.curves.items()}
        plot_teacher_nll(curves, output / "teacher_nll_per_step.png",
                         title=f"Teacher NLL of the partial response, tau {self.trace_tau}")
        rows = [{"seed": seed, **{k: v for k, v in result.to_dict().items() if k != "samples"}}
                for seed, result in self.results]
        document = {**self.payload, "results": rows, "study": study, "teacher_nll_per_step": self.curves,
                    "nll_vs_decode_step_spearman": self.hard_first}
        write_atomic(output / "results.json", json.dumps(document, indent=1, default=str))
        with gzip.open(output / "records.jsonl.gz.partial", "wt") as handle:
            for seed, result in self.results:
                for sample in result.samples:
                    handle.write(json.dumps({"model": result.model, "seed": seed,
                                             "threshold": result.decoding["threshold"], **dataclasses.asdict(sample)})
                                 + "\n")
        (output / "records.jsonl.gz.partial").replace(output / "records.jsonl.gz")
        return output / "table.md"


def load_result(path: Path) -> EvalResult:
    """An :class:`~trims_hf.evaluation.evaluate.EvalResult` back from the file :func:`~trims_hf.evaluation.results.save_results`
    wrote."""
    (row,) = json.loads(path.read_text())["results"]
    return EvalResult(**{**row, "samples": [SampleRecord(**s) for s in row["samples"]]})


def environment(device: str, study_file: Path) -> dict[str, Any]:
    """What the numbers ran on: the code (git commit when there is a checkout, and a hash of the library's and the
    study's own sources, which a copied tree has too), library versions, the device and the dtype of the models."""
    library = Path(__file__).resolve().parents[1]  # the trims_hf package
    digest = hashlib.sha256()
    folders = dict.fromkeys([library, study_file.resolve().parent])  # the demo's study lives in the library
    for folder in folders:
        for path in sorted(folder.glob("**/*.py")):
            digest.update(path.relative_to(folder.parent).as_posix().encode() + b"\0" + path.read_bytes())
    try:
        commit = subprocess.run(["git", "-C", str(library), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"git_commit": commit, "source_sha256": digest.hexdigest()[:16], "libraries": library_versions(),
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "dtype": "bfloat16" if device == "cuda" else "float32"}


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB pieces: how a study records the weights file it ran on."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while piece := handle.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()
