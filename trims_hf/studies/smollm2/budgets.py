"""The replication's stage budgets on an H100: FLOP counts at a measured efficiency plus measured overheads
(:func:`stage_budgets`, what a protocol was sized with and the runtime's prior before a unit of its kind is timed),
and window 1's measured unit times scaled to a protocol (:func:`measured_budgets`); :func:`budget_table` is what
``replicate.py --budgets`` prints. Every constant says where its number comes from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...settings import ScoringOptions
from ..accelerators import TimeModel
from ..protocol import VARIANTS
from ..study import models_plan
from .protocol import Protocol

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
on the same CPU: once per study (:func:`.study.converted`)."""
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


WINDOW_1_ANSWER_TOKENS = 46.0
"""Mean generated tokens per answer over window 1's 20,000 graded problems (``records.jsonl.gz``)."""
CHAIN_ANSWER_TOKENS = 68.0
"""Mean SmolLM2 tokens of a chain problem's reference answer (3 steps; 300 rows: 64.7 at level 1, 70.7 at level 2),
what an accurate protocol-2 model generates."""


def measured_budgets(p: Protocol, window_1: Mapping[str, Any]) -> list[tuple[str, float, bool]]:
    """:func:`stage_budgets`' units with window 1's measured wall times (``window_1``: its report, results.json, with
    the wall time of every unit, ``unit_wall_s``, and the protocol it ran) scaled to ``p``: training by steps (a SmolLM2
    step at batch 32 is host-bound: ~0.15 s whatever its FLOPs), the score stage by rows, the selection and every
    evaluation by decoding batches (host-bound too: a batch of 500 costs about what one of 250 does) and by the
    answers' length (decoding steps), each evaluation at the slowest time window 1 measured at its threshold (at any
    threshold for one it did not run). Install, start and report keep their estimates."""
    walls, ran = window_1["unit_wall_s"], window_1["protocol"]

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


def budget_table(p: Protocol, window_1: Mapping[str, Any]) -> str:
    """:func:`stage_budgets` (estimated from counts) and :func:`measured_budgets` (``window_1``'s unit times) as the
    Markdown table of recipes/smollm2/README.md, with the running totals (the compute call's clock) and the totals of
    the main comparison and of everything."""
    rows = ["| unit | part | estimate (s) | ends at (s) | from window 1 (s) | ends at (s) |", "|---|---|---|---|---|---|"]
    totals = {"estimate": [0.0, 0.0], "window 1": [0.0, 0.0]}
    for (unit, estimate, tail), (_, measured, _) in zip(stage_budgets(p), measured_budgets(p, window_1), strict=True):
        for name, seconds in (("estimate", estimate), ("window 1", measured)):
            totals[name][0] += seconds
            totals[name][1] += 0.0 if tail else seconds
        rows.append(f"| {unit} | {'tail' if tail else 'main'} | {estimate:.0f} | {totals['estimate'][0]:.0f} | "
                    f"{measured:.0f} | {totals['window 1'][0]:.0f} |")
    return "\n".join(rows) + "\n\n" + "; ".join(
        f"{name}: main comparison (with install, start and report) {main:.0f} s, everything {clock:.0f} s"
        for name, (clock, main) in totals.items())

