"""A TRIMS study, shared by ``trims demo`` and ``recipes/smollm2``: :class:`Study` runs the stages every study has
(data, the pretrained model, teacher scores, the MDLM base, the variants and their evaluations, the report) as
resumable units of work under the study's protocol (:class:`~trims_hf.studies.protocol.StudyProtocol`) and a time budget;
the functions before it are its steps (scoring, preparation, training, traced evaluation, reports).

A study compares the MDLM baseline with the TRIMS orderings (:data:`~trims_hf.studies.protocol.VARIANTS`), each continued
from one base with the same steps, data order and seed, so they differ only by their masking. A study's own file
says only what is its own: its data, its pretrained model, its test task, and any stage it adds.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from datasets import Dataset, load_dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from ..data import schema
from ..data.buckets import bucket_statistics
from ..distributed import name_cpu_accelerator
from ..evaluation.evaluate import EvaluationInterrupted, evaluate_task
from ..evaluation.results import save_results
from ..evaluation.tasks.base import Task, read_json_rows
from ..generation import TrajectoryRecorder
from ..model_config import ModelConfig, load_model, load_tokenizer, resolve_student
from ..reports import weights_fingerprint, write_atomic
from ..students import add_mask_token, prepare_student
from ..training.config import MDLMConfig
from .protocol import BASE, PROTOCOL_FILE, StudyProtocol
from .stages import (
    Evaluation,
    StudyReport,
    check_rows_fit,
    environment,
    load_result,
    plot_trace_order,
    prepared_rows,
    score_rows,
    trace_metrics,
    train_student,
)
from .units import KEY_FILE, OutOfBudget, StudyInterrupted, Units, claim_study_folder


def slug(name: str) -> str:
    """A file-name form of a model name (``TRIMS hard-to-easy`` -> ``trims_hard_to_easy``)."""
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


# -- the runner -------------------------------------------------------------------------------------------------------
class PlannedUnit(NamedTuple):
    """A unit of the models stage: a model's training (``threshold`` None) or its evaluation at ``threshold``."""

    name: str
    folder: str
    """``base`` or ``<slug>-seed<seed>``: where its weights and its evaluations live."""
    seed: int | None
    threshold: float | None
    tail: bool


def models_plan(p: StudyProtocol) -> list[PlannedUnit]:
    """Every unit of the models stage, in the pre-registered order: the base evaluated, then for each seed each variant
    trained from the base and evaluated right away at the main thresholds; then the tail, which a call out of time
    drops from its end: the tail variants likewise, then every model at the tail thresholds."""

    def units(name: str, seed: int | None, tail: bool) -> list[PlannedUnit]:
        folder = "base" if name == BASE else f"{slug(name)}-seed{seed}"
        training = [] if name == BASE else [PlannedUnit(name, folder, seed, None, tail)]
        return training + [PlannedUnit(name, folder, seed, tau, tail) for tau in p.thresholds]

    base = units(BASE, None, False) if p.EVALUATE_BASE else []
    main = base + [u for seed in p.sft_seeds() for name in p.variants for u in units(name, seed, False)]
    tail = [u for seed in p.sft_seeds() for name in p.tail_variants for u in units(name, seed, True)]
    evaluated = [u for u in main + tail if u.threshold == p.thresholds[0]]
    return main + tail + [u._replace(threshold=tau, tail=True) for u in evaluated for tau in p.tail_thresholds]


def seed_tag(seed: int | None) -> str:
    """`` (seed N)`` after a model's name, nothing for the base, which no seed of the variants trained."""
    return "" if seed is None else f" (seed {seed})"


def unit_label(unit: PlannedUnit) -> str:
    seed = seed_tag(unit.seed)
    return f"train {unit.name}{seed}" if unit.threshold is None else f"{unit.name}{seed} tau {unit.threshold}"


def on_device(model: PreTrainedModel, device: str) -> PreTrainedModel:
    """bf16 on a GPU, float32 on a CPU, in eval mode."""
    return model.to(device, dtype=torch.bfloat16 if device == "cuda" else torch.float32).eval()


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``: a time as a progress line says it."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


REPORT_FILES = ("results.json", "table.md", "frontier.png", "teacher_nll_per_step.png")
"""What :meth:`Study.stage_report` copies to a results folder (the per-problem records stay in the study)."""


class Study:
    """A study run in a folder: the stages every TRIMS study shares, each made of resumable :class:`Units`.

    ``data``        (subclass) ``data/train.jsonl`` (prompt/completion rows) and whatever its :meth:`test_task` reads
    ``pretrained``  (subclass) ``pretrained/``: the causal LM and tokenizer the base starts from; the teacher too,
                    unless :meth:`load_teacher` says otherwise (the paper's teacher is used as it is)
    ``score``       every training completion scored by the teacher with ``trims score``'s code path
    ``base``        the pretrained model with a mask token, made a Dream-style student, MDLM-trained
    ``models``      :func:`models_plan`: the variants continued from the base, each evaluated right away
    ``report``      results.json, table.md, the plots and records.jsonl.gz, from the finished evaluations only

    A study adds stages by naming them in :attr:`stages` and defining ``stage_<name>``. Nothing here knows the task
    or the models' sizes: those come from the protocol and the subclass.
    """

    stages: tuple[str, ...] = ("data", "pretrained", "score", "base", "models", "report")
    teacher_name = "the pretrained model"
    source = "trims_hf study"
    """How the scored data's card names where it came from."""

    def __init__(self, output: Path, protocol: StudyProtocol, device: str = "cpu", deadline: float = math.inf,
                 results_dir: Path | None = None) -> None:
        self.output, self.protocol, self.results_dir = Path(output), protocol, results_dir
        self.units = Units(protocol, device, deadline, progress=self.progress)
        if device == "cpu":
            name_cpu_accelerator()
        self.started = time.monotonic()
        self.position: tuple[str, int] = (self.stages[0], 0)
        """The unit running now: (stage, 0), or ("models", its index in :func:`models_plan`)."""
        self.dropped: list[str] = []
        """Tail units this invocation dropped for time (:meth:`stage_models`)."""
        self.loaded: dict[str, Any] = {}

    @property
    def device(self) -> str:
        return self.units.device

    # -- what a study provides --------------------------------------------------------------------------------------
    def stage_data(self) -> None:
        raise NotImplementedError

    def stage_pretrained(self) -> None:
        raise NotImplementedError

    def test_task(self) -> Task:
        """The held-out task every model is evaluated on."""
        raise NotImplementedError

    def training_rows(self) -> list[dict[str, str]]:
        """``data/train.jsonl``: the prompt/completion rows (:func:`~trims_hf.data.schema.as_prompt_completion`) the
        teacher scores and the students train on."""
        return read_json_rows(self.output / "data" / "train.jsonl")

    def pretrain_tiny(self, steps: int, lr: float, batch_size: int) -> None:
        """The ``pretrained`` stage of a study whose pretrained model (the student's start, often the teacher) is a tiny
        causal Llama trained here, autoregressively, on its training rows, with ``data/tokenizer``; its size and data
        seed are the protocol's ``hidden_size``, ``num_layers``, ``num_heads`` and ``data_seed``."""
        from .tiny import pretrain_tiny_llama

        folder, p = self.output / "pretrained", self.protocol
        tokenizer = PreTrainedTokenizerFast.from_pretrained(self.output / "data" / "tokenizer")
        if not self.units.finished(folder, "pretrained", "pretrained"):  # before the unit empties its folder
            check_rows_fit(p, self.training_rows(), tokenizer, self.teacher_tokenizer())
        if not self.units.unit(folder, "pretrained", "pretrained"):
            return
        started = time.perf_counter()
        pretrain_tiny_llama(folder, tokenizer, self.training_rows(), (p.hidden_size, p.num_layers, p.num_heads),
                            p.student_format.max_length, steps, lr, batch_size, p.data_seed,
                            self.output / "work" / "pretrained")
        self.units.done(folder, "pretrained", started, {"steps": steps}, stage="pretrained")

    def teacher_tokenizer(self) -> PreTrainedTokenizerBase:
        """The scoring teacher's tokenizer, read without its weights: the pretrained model's, ``data/tokenizer``."""
        return PreTrainedTokenizerFast.from_pretrained(self.output / "data" / "tokenizer")

    def load_teacher(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """The scoring teacher: the pretrained model as it is (bf16 on a GPU, float32 on a CPU)."""
        from ..data.teacher import load_teacher

        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        return load_teacher(str(self.output / "pretrained"), device=self.device, dtype=dtype)

    def prior_s(self, kind: str, steps: int = 0) -> float:
        """Expected seconds of a unit of ``kind`` (``train``, ``eval``, ``traced``) before one has been timed."""
        return 0.0

    def eval_tag(self) -> str:
        """What an evaluation's unit name adds, so that a changed test task redoes the evaluations."""
        return ""

    def report_extra(self) -> dict[str, Any]:
        """What this study adds to results.json."""
        return {}

    def before_base_training(self, model: PreTrainedModel) -> dict[str, Any]:
        """Change how the base trains (e.g. :class:`~trims_hf.studies.annealing.AttentionAnnealing`); returns what the base's
        unit records about it."""
        return {}

    # -- shared pieces ----------------------------------------------------------------------------------------------
    def teacher(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        if "teacher" not in self.loaded:
            self.loaded["teacher"] = self.load_teacher()
        return self.loaded["teacher"]

    def student_config(self, folder: Path) -> ModelConfig:
        """A saved student of this study: its weights in ``folder``, the tokenizer with the mask token saved with the
        base (the variants save none)."""
        return ModelConfig(str(folder), tokenizer_name_or_path=str(self.output / "base"))

    def tokenizer(self) -> PreTrainedTokenizerBase:
        if "tokenizer" not in self.loaded:
            self.loaded["tokenizer"] = load_tokenizer(self.student_config(self.output / "base"))
        return self.loaded["tokenizer"]

    def load_student(self, folder: Path) -> PreTrainedModel:
        """A saved Dream-style student (its config carries the kind and the mask id), loaded as ``trims eval`` loads it."""
        model = self.student_config(folder)
        return load_model(model, resolve_student(model))

    def prepared(self, ordering: str, tokenizer: PreTrainedTokenizerBase | None = None) -> Dataset:
        """The scored rows prepared for the student with the protocol's buckets in ``ordering`` (kept, not saved)."""
        if ordering not in self.loaded:
            scored = load_dataset(str(self.output / "score" / "scored"), split="train")
            self.loaded[ordering] = prepared_rows(self.protocol, scored, tokenizer or self.tokenizer(), ordering)
        return self.loaded[ordering]

    def expected_s(self, kind: str, steps: int = 0) -> float:
        """Expected wall time of a unit: from the finished units of the same kind in this study when there are some
        (``train``: the slowest seconds per step seen; ``eval``, ``traced``: the slowest such evaluation), before the
        first :meth:`prior_s`."""
        measured = self.measured_s(kind, steps)
        return self.prior_s(kind, steps) if measured is None else measured

    def measured_s(self, kind: str, steps: int = 0) -> float | None:
        """:meth:`expected_s` from the finished units alone; None before one of the kind has finished."""
        walls = [json.loads(path.read_text()) for path in self.output.glob("**/unit.json")]
        if kind == "train":
            rates = [w["wall_s"] / w["steps"] for w in walls if w.get("steps")]
            return steps * max(rates) if rates else None
        measured = [w["wall_s"] for w in walls if "threshold" in w and w.get("traced") == (kind == "traced")]
        return max(measured) if measured else None

    def stage_estimate(self, stage: str) -> tuple[str, float | None]:
        """(kind, expected seconds or None when not known yet) of a stage's unit, for :meth:`progress`; a study with
        a stage of its own may say more."""
        p = self.protocol
        estimates = {"data": 0.0, "report": 0.0, "base": self.measured_s("train", p.base_steps)}
        kind = "training" if stage == "base" else stage
        return kind, estimates.get(stage, self.prior_s(stage) or None)

    def progress(self) -> str:
        """`` (unit 7 of 19, 2 min 10 s so far; about 3 min 40 s left)``: where the run is when a unit starts, and the
        time left as the finished units measure it (:meth:`measured_s`; a study's :meth:`prior_s` before that); while
        a kind of unit has not been timed yet, the line names it and gives the time left as a lower bound."""
        p, plan = self.protocol, models_plan(self.protocol)
        positions = [(stage, index) for stage in self.stages
                     for index in (range(len(plan)) if stage == "models" else [0])]
        at = positions.index(self.position) if self.position in positions else 0
        in_models = self.position[0] == "models"  # before, a unit's name may not be known yet (a test task's tag)
        known, untimed = 0.0, []
        for stage, index in positions[at:]:
            current = (stage, index) == self.position
            if stage == "models":
                unit = plan[index]
                if not current and in_models and self.finished(unit):
                    continue
                kind = "train" if unit.threshold is None else "traced" if p.traced(unit.threshold, unit.seed) else "eval"
                seconds = self.measured_s(kind, p.variant_steps)
                seconds = self.prior_s(kind, p.variant_steps) or None if seconds is None else seconds
                kind = {"train": "training", "eval": "evaluation", "traced": "traced evaluation"}[kind]
            elif not current and (self.output / stage / KEY_FILE).is_file():
                continue
            else:
                kind, seconds = self.stage_estimate(stage)
            if seconds is None:
                untimed += [kind] if kind not in untimed else []
            else:
                known += seconds
        left = (f"about {duration(known)} left" if not untimed else
                f"{f'over {duration(known)} left' if known else 'time left unknown'}; not timed yet: {', '.join(untimed)}")
        return f" (unit {at + 1} of {len(positions)}, {duration(time.monotonic() - self.started)} so far; {left})"

    def training_record(self, args: MDLMConfig, steps: int, model: PreTrainedModel) -> dict[str, Any]:
        """What a student run records to be checked against the protocol: its seed, ratio and ordering as the trainer
        got them, its steps and a checksum of its starting weights (the first batch's hash is added by training)."""
        return {"seed": args.seed, "trajectory_ratio": args.trajectory_ratio, "bucket_ordering": args.bucket_ordering,
                "steps": steps, "start_weights": weights_fingerprint(model)}

    # -- the stages -------------------------------------------------------------------------------------------------
    def stage_score(self) -> None:
        """Teacher NLL and entropy of every training completion token through ``trims score``'s code path."""
        folder = self.output / "score"
        if not self.units.unit(folder, "score", "score"):
            return
        started = time.perf_counter()
        score_rows(self.protocol, self.training_rows(), folder / "scored", self.teacher(), self.teacher_name,
                   source=self.source)
        self.units.done(folder, "score", started, stage="score")

    def stage_base(self) -> None:
        """The pretrained model with a mask token, made a Dream-style student, MDLM-trained into the base."""
        folder, p = self.output / "base", self.protocol
        if not self.units.unit(folder, "base", "base", expected_s=self.expected_s("train", p.base_steps)):
            return
        started = time.perf_counter()
        pretrained = self.output / "pretrained"
        model, tokenizer = AutoModelForCausalLM.from_pretrained(pretrained), AutoTokenizer.from_pretrained(pretrained)
        model = prepare_student(model, "dream", add_mask_token(model, tokenizer))
        data = self.prepared("hard_to_easy", tokenizer)
        buckets = bucket_statistics(data[schema.STUDENT_SCORE], data[schema.BUCKET_IDS], p.masking.num_buckets)
        args = p.student_args(self.output / "work" / "base", BASE, p.base_seed(), self.device)
        record = {**self.training_record(args, p.base_steps, model), **self.before_base_training(model)}
        train_student(model, tokenizer, data, args, record)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)  # a complete student folder: `trims train` / `trims eval` can use it directly
        record["saved_weights"] = weights_fingerprint(self.load_student(folder))  # what every variant starts from
        self.units.done(folder, "base", started, {**record, "buckets": buckets}, stage="base")

    def stage_models(self) -> None:
        """The units of :func:`models_plan` in order. A unit of the main comparison that would end past the deadline
        stops the run (:class:`OutOfBudget`; running it again continues); the first tail unit that would drops itself
        and every later one, named in one line: the pre-registered tail, never a choice among its units."""
        plan = models_plan(self.protocol)
        for index, unit in enumerate(plan):
            self.position = ("models", index)
            try:
                if unit.threshold is None:
                    self.train_variant(unit)
                else:
                    self.evaluate(unit)
            except OutOfBudget as stop:
                if not unit.tail:
                    raise
                self.dropped = [unit_label(u) for u in plan[index:] if not self.finished(u)]
                print(f"out of time before {stop}: dropped the rest of the pre-registered tail, {len(self.dropped)} "
                      f"units ({'; '.join(self.dropped)})", flush=True)
                return

    def unit_folder(self, unit: PlannedUnit) -> Path:
        if unit.threshold is None:
            return self.output / "variants" / unit.folder
        return self.output / "eval" / unit.folder / f"tau{unit.threshold}"

    def unit_name(self, unit: PlannedUnit) -> str:
        if unit.threshold is None:
            return f"variant {unit.folder}"
        return f"eval {unit.folder}{self.eval_tag()} tau {unit.threshold}"

    def finished(self, unit: PlannedUnit) -> bool:
        return self.units.finished(self.unit_folder(unit), self.unit_name(unit))

    def model_folder(self, unit: PlannedUnit) -> Path:
        return self.output / ("base" if unit.folder == "base" else f"variants/{unit.folder}")

    def train_variant(self, unit: PlannedUnit) -> None:
        """One variant continued from the base with its seed's data order; only the masking differs. Its unit records
        what shows it: the seed, ratio and ordering the trainer got, the checksum of the weights it started from (the
        base's saved ones) and the hash of its first batch (the same for every variant of a seed)."""
        p, folder = self.protocol, self.unit_folder(unit)
        if not self.units.unit(folder, self.unit_name(unit), expected_s=self.expected_s("train", p.variant_steps)):
            return
        started = time.perf_counter()
        model = self.load_student(self.output / "base")
        args = p.student_args(self.output / "work" / unit.folder, unit.name, unit.seed, self.device)
        record = self.training_record(args, p.variant_steps, model)
        train_student(model, self.tokenizer(), self.prepared(p.variant(unit.name)[1]), args, record)
        model.save_pretrained(folder)
        self.units.done(folder, self.unit_name(unit), started, {"model": unit.name, **record})

    def evaluate(self, unit: PlannedUnit) -> None:
        """Accuracy and tokens per step of one model at one threshold on the test task; where the trace policy takes
        traces, also its decode-order correlation and per-step teacher NLL curve."""
        p, folder, tau = self.protocol, self.unit_folder(unit), unit.threshold
        traced = p.traced(tau, unit.seed)
        if not self.units.unit(folder, self.unit_name(unit), expected_s=self.expected_s("traced" if traced else "eval")):
            return
        started = time.perf_counter()
        if "task" not in self.loaded:
            task = self.test_task()
            self.loaded["task"] = task, {e.id: task.plain_text(task.messages(e)) for e in task.load()}
        task, prompts = self.loaded["task"]
        if self.loaded.get("model", (None,))[0] != unit.folder:
            self.loaded["model"] = unit.folder, on_device(self.load_student(self.model_folder(unit)), self.device)
        result, trace = self.decode(unit, task, prompts, folder)
        save_results([result], folder / "result.json")
        if trace is not None:
            write_atomic(folder / "trace.json", json.dumps({
                "teacher_nll_per_step": trace.curve, "nll_vs_decode_step_spearman": trace.hard_first,
                "traced_problems": trace.traced, "correlated_problems": trace.correlated}))
        self.units.done(folder, self.unit_name(unit), started,
                        {"model": unit.name, "seed": unit.seed, "threshold": tau, "traced": traced})

    def decode(self, unit: PlannedUnit, task: Task, prompts: Mapping[str, str], folder: Path) -> Evaluation:
        """Accuracy and tokens per step of the loaded model at the unit's threshold; when the trace policy takes
        traces (:meth:`StudyProtocol.traced`), also its decode order (plotted into ``folder``), per-step teacher NLL
        and hard-first correlation, and only then is the teacher loaded. A traced evaluation decodes every problem
        afresh (resumed records would leave gaps in the traces), so only the others resume from their records."""
        p, tau, name = self.protocol, unit.threshold, unit.name
        traced, recorder, tokenizer = p.traced(tau, unit.seed), TrajectoryRecorder(), self.tokenizer()
        records = self.output / "work" / "records" / f"{unit.folder}-tau{tau}.jsonl"
        result = evaluate_task(self.loaded["model"][1], tokenizer, task, p.decoding_at(tau), batch_size=p.eval_batch_size,
                               hooks=[recorder] if traced else [], model_name=name,
                               records_file=None if traced else records)
        metrics = None
        if traced:
            metrics = trace_metrics(recorder, prompts, tokenizer, self.teacher(), p.trace_samples, p.teacher_context,
                                    p.decoding.block_length)
            plot_trace_order(recorder, p.trace_samples, folder / "decode_order.png",
                             title=f"{name}{seed_tag(unit.seed)}: decode order at tau {tau}")
        print(f"{name}{seed_tag(unit.seed)} tau {tau}: accuracy {result.accuracy:.3f}, tokens/step "
              f"{result.tokens_per_step:.2f}", flush=True)
        return Evaluation(result, metrics)

    def stage_report(self) -> None:
        """results.json, table.md, frontier.png, teacher_nll_per_step.png, the decode-order plots and
        records.jsonl.gz from the finished evaluation units; rebuilt whenever more have finished, and marked partial
        while some are missing; then copied to the results folder, if any."""
        p, folder = self.protocol, self.output / "report"
        planned = [unit for unit in models_plan(p) if unit.threshold is not None]
        done = [unit for unit in planned if self.finished(unit)]
        name = f"report ({len(done)} of {len(planned)} evaluations)"
        if done and self.units.unit(folder, name, timed=False):
            started = time.perf_counter()
            self.write_report(folder, planned, done)
            self.units.done(folder, name, started, {"results": len(done)})
        self.copy_results(folder)

    def write_report(self, folder: Path, planned: Sequence[PlannedUnit], done: Sequence[PlannedUnit]) -> None:
        p = self.protocol
        missing = [unit_label(u) for u in planned if u not in done and not u.tail]
        dropped = [unit_label(u) for u in planned if u not in done and u.tail]
        report = StudyReport([], p.sft_seeds(), p.trace_threshold(), p.trace_samples, {})
        traces = {}
        for unit in done:
            unit_folder = self.unit_folder(unit)
            report.results.append((unit.seed, load_result(unit_folder / "result.json")))
            if (unit_folder / "trace.json").is_file():
                traces[f"{unit.name}, seed {unit.seed}"] = trace = json.loads((unit_folder / "trace.json").read_text())
                report.curves[unit.name] = trace["teacher_nll_per_step"]
                report.hard_first[unit.name] = trace["nll_vs_decode_step_spearman"]
                report.correlated[unit.name] = (trace["correlated_problems"], trace["traced_problems"])
                shutil.copyfile(unit_folder / "decode_order.png", folder / f"decode_order_{unit.folder}.png")
        walls = [json.loads(path.read_text()) for path in sorted(self.output.glob("**/unit.json"))]
        protocol_file = self.output / PROTOCOL_FILE
        report.payload = {
            "protocol": dataclasses.asdict(p), "resolved": p.resolved(), "protocol_fingerprint": p.fingerprint(),
            "sources": json.loads(protocol_file.read_text())["sources"] if protocol_file.is_file() else {},
            "environment": environment(self.device, Path(inspect.getfile(type(self)))), "device": self.device,
            "teacher": self.teacher_name, "complete": not missing and not dropped,
            "main_comparison_complete": not missing, "missing": missing, "dropped": dropped,
            "buckets": json.loads((self.output / "base" / "unit.json").read_text())["buckets"],
            "unit_wall_s": {w["unit"]: w["wall_s"] for w in walls if not w["unit"].startswith("report")},
            "variants": {name: dict(zip(("trajectory_ratio", "bucket_ordering"), p.variant(name), strict=True))
                         for name in (*p.variants, *p.tail_variants)},
            "traces": traces, **self.report_extra()}
        if missing:
            report.notes.append(f"PARTIAL: {len(missing)} of {len(planned)} evaluations not run yet "
                                f"({'; '.join(missing)}).")
        if dropped:
            report.notes.append(f"Dropped for time (the pre-registered tail, from its end): {'; '.join(dropped)}.")
        print("\n" + report.write(folder).read_text(), flush=True)

    def copy_results(self, report: Path) -> None:
        """The results folder's copy of :data:`REPORT_FILES`; nothing before a report exists (a run that stops before
        any evaluation has finished)."""
        if self.results_dir is None or not (report / "results.json").is_file():
            return
        self.results_dir.mkdir(parents=True, exist_ok=True)
        for name in REPORT_FILES:
            shutil.copyfile(report / name, self.results_dir / name)
        print(f"copied {', '.join(REPORT_FILES)} to {self.results_dir}")

    def interruption(self, stop: KeyboardInterrupt) -> str:
        """Where a Ctrl-C stopped the run and what was kept, in one line (an evaluation's saved problems, which the
        rerun continues from, included)."""
        units = self.units
        kept = len(units.skipped) + len(units.ran) - (units.current is not None)
        saved = f" ({stop.done} of {stop.total} problems saved)" if isinstance(stop, EvaluationInterrupted) else ""
        where = f"in unit {units.current!r}{saved}" if units.current else "between units"
        return (f"{where}; {kept} finished unit{'s' * (kept != 1)} kept in {self.output}: run the same command again "
                "to continue.")

    def run(self, until: str = "report") -> bool:
        """The stages up to ``until``, skipping finished units; False when the time budget stopped it (the finished
        models' report is then written, marked partial, and running it again continues). Ctrl-C raises
        :class:`StudyInterrupted`, which says what was kept."""
        claim_study_folder(self.output, f"the study folder {self.output}")
        start = self.started = time.monotonic()
        stages = self.stages[: self.stages.index(until) + 1]
        try:
            for stage in stages:
                reached, self.position = stage, (stage, 0)
                getattr(self, f"stage_{stage}")()
        except OutOfBudget as stop:
            print(f"stopped before {stop} after {(time.monotonic() - start) / 60:.1f} min; run the same command again "
                  "to continue.", flush=True)
            if "report" in stages and reached == "models":  # every stage before it finished: the test task is known
                self.stage_report()
            return False
        except KeyboardInterrupt as stop:
            raise StudyInterrupted(self.interruption(stop)) from None
        print(f"done in {time.monotonic() - start:.0f} s: ran {len(self.units.ran)} units, skipped "
              f"{len(self.units.skipped)} finished ones" + (f", dropped {len(self.dropped)} of the tail for time."
                                                            if self.dropped else "."), flush=True)
        return True
