"""Time budgets of the parts of one GPU window (``run_all.sh``), from FLOP and byte counts on an H100 SXM.

Each part gets: the process start (imports; ``STARTUP_S``), building its models (``BUILD_S`` each), and its work at
assumed achieved rates (:data:`WINDOW`, the library's :class:`~trims_hf.studies.accelerators.TimeModel`: a fraction of the
H100's dense bf16 peak for matmul-bound work, of its bandwidth for weight-bound decoding steps), plus a fixed host
cost per training or decoding step, all times the slack. The counts
come from the same functions and settings ``bench/real_size.py`` measures with (parameter counts of the real shapes
built on the meta device, :func:`real_size_parts.common.training_flops_per_token`,
:func:`real_size_parts.decode.weight_read_bytes`), so a change of a part's size changes its budget. A part that
overruns its budget is stopped there (its lines so far kept); an H200 has the H100's arithmetic and more bandwidth,
so these budgets hold for it too.

Prints ``part seconds [real_size.py flags]`` lines for ``run_all.sh``, in its order; ``--explain-to FILE`` appends the
arithmetic to FILE as one JSON line; ``--decode-batches`` narrows the decode part (its budget and its flags). The
flags are the same at both scales, so the CPU pre-flight (``--scale tiny``) runs what the device will; there every
part gets ``TINY_BUDGET_S``: the goal is that nothing fails, not speed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from trims_hf.commands.recipe import read_recipe
from trims_hf.settings import ScoringOptions
from trims_hf.studies.accelerators import TimeModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the model shapes and FLOP counts of real_size.py's parts

from decode import COMPILED  # noqa: E402
from real_size_parts.common import build_model, linear_weights, training_flops_per_token  # noqa: E402
from real_size_parts.decode import (  # noqa: E402
    DECODE_BATCHES,
    DECODE_GEN_LENGTH,
    DECODE_PROMPT_TOKENS,
    parse_decode_batches,
    weight_read_bytes,
)
from real_size_parts.recipe import recipe_path  # noqa: E402
from real_size_parts.train import SEQUENCE_LENGTH  # noqa: E402
from real_size_parts.zero2 import ZERO2_STEPS  # noqa: E402

WINDOW = TimeModel(matmul_efficiency=0.40, slack=1.5)
"""The parts at the training goal's 40% of the H100's bf16 peak and 70% of its bandwidth; with the 1.5x slack a part
still finishes at ~27%, so a run that misses the goal is measured, not cut."""
STARTUP_S = 20.0
"""One Python process importing torch, transformers, peft, accelerate and trims_hf from a cold disk."""
BUILD_S = 15.0
"""One 8B model built on the GPU from its config (allocation + random init of 16 GB)."""
TRAIN_STEP_HOST_S = 0.10
"""Per optimizer step outside the matmuls: collation on the CPU, clipping, AdamW over the LoRA weights, launches."""
DECODE_STEP_HOST_S = 0.004
"""Per decoding step outside the forward: confidences, the threshold strategy, hooks."""
DEEPSPEED_INIT_S = 30.0
"""DeepSpeed's engine set-up for ZeRO-2 on one process (partitioning, buckets, the first step's allocations)."""
TESTS_S = 150.0
"""The CUDA variants of tests/test_cuda_correctness.py on the tiny fixtures: launch-bound, no FLOP count matters. On the
H100 of 2026-11-27 they took 104 s, 39 s of it the first compiled-blocks case, which stopped compiling at dynamo's limit
of 8 graphs. Each compiled case now compiles from a reset, the blocks sharing their graphs (8 on the CPU for the LLaDA
fixture, about what that case compiled before its limit), and a depth check compiles a few more: 104 s and half again,
an estimate until a window measures it."""
TINY_BUDGET_S = 600.0
GRADIENT_CHECKPOINTING_COST = 4 / 3
"""Recomputing each layer's forward during the backward: one extra forward per 3 units of forward+backward."""


@dataclass(frozen=True)
class Settings:
    """What run_all.sh asks of bench/real_size.py (at real scale smaller than its defaults, to fit one window): the
    budgets are computed from these and :func:`flags` passes the same values on."""

    steps: int = 4
    max_batch: int = 16
    score_budget_s: float = 45.0
    cache_modes: tuple[str, ...] = ("none", "dual")
    step_modes: tuple[str, ...] = ("eager", "static", "graph", "graph" + COMPILED)
    """Decode step modes; static and the compiled blocks at batch 1 only (``real_size_parts.decode.decode_part``)."""
    decode_batches: tuple[int, ...] | None = None
    """Decode batches, rising from 1; None: the scale's (``real_size_parts.decode.DECODE_BATCHES``). ``1`` alone fits
    the batch-1 rows, the ones the forward's bound is judged at, into the minutes a window has left."""
    train_variants: tuple[str, ...] = ("eager", "no_dropout", "compiled")
    checkpointing: tuple[str, ...] = ("off",)
    recipe_steps: int = 6
    """Optimizer steps of the recipe part (each the recipe's global batch), the first one compiling."""

    def flags(self, part: str) -> list[str]:
        return {"train": ["--steps", str(self.steps), "--max-batch", str(self.max_batch),
                          "--train-variants", ",".join(self.train_variants),
                          "--checkpointing", ",".join(self.checkpointing)],
                "recipe": ["--steps", str(self.recipe_steps)],
                "decode": ["--cache-modes", ",".join(self.cache_modes), "--step-modes", ",".join(self.step_modes),
                           *(["--decode-batches", ",".join(map(str, self.decode_batches))] if self.decode_batches else [])],
                "score": ["--score-budget-s", str(self.score_budget_s)]}.get(part, [])


COMPILE_S = 90.0
"""The compiled variant: one decoder block compiled forward and backward, twice (the first batch shape, then the
dynamic one the batch search's second shape triggers)."""


def train_budget(settings: Settings, explain: dict) -> float:
    """Per variant and checkpointing setting: batch search by doubling to ``max_batch`` (all assumed to fit: the most
    work), then ``steps`` TRIMS and ``steps`` MDLM steps at batch 1 and at ``max_batch``; the profiled steps; the
    compiled variant's compile time."""
    model = build_model("llada", "real", "meta", torch.bfloat16)
    length = SEQUENCE_LENGTH["real"]
    lora = 0  # the LoRA matmuls are ~1% of the frozen ones: inside the slack
    flops_per_token = training_flops_per_token(model.config, length, linear_weights(model), lora)
    searched_rows = 2 * settings.max_batch - 1
    measured_rows = 2 * settings.steps * (1 + settings.max_batch)
    per_setting = {"off": 1.0, "on": GRADIENT_CHECKPOINTING_COST}
    runs = len(settings.train_variants) * sum(per_setting[c] for c in settings.checkpointing)
    rows = (searched_rows + measured_rows) * runs + 4 * settings.max_batch  # + the profiled steps
    steps = round((settings.max_batch.bit_length() + 4 * settings.steps) * runs) + 4
    work = WINDOW.matmul_s(rows * length * flops_per_token)
    explain["train"] = {"flops_per_token": flops_per_token, "rows_of_1024_tokens": rows, "steps": steps,
                        "matmul_s": round(work, 1), "host_s": steps * TRAIN_STEP_HOST_S}
    compile_s = COMPILE_S if "compiled" in settings.train_variants else 0.0
    return STARTUP_S + BUILD_S * len(settings.train_variants) + work + steps * TRAIN_STEP_HOST_S + compile_s


DECODE_COMPILE_S = 60.0
"""A step with compiled blocks, per cache mode: the decoder block's forward compiled with symbolic lengths, once for
every block (they share their graphs): one graph without a cache, three with one (the forward that allocates it, the
refresh, the window; the prefix and dual caches share them). An estimate: the H100 of 2026-11-28 compiled two distinct
8B-block graphs (no cache; the cache-allocating forward, traced again for 6 more blocks) and decoded eight rows in a
100-s part; the refresh and window graphs were not reached there."""


def recipe_budget(settings: Settings, explain: dict) -> float:
    """The LLaDA recipe's batch search (every candidate from the global batch down to 1 probed in full: the most work),
    then ``recipe_steps`` optimizer steps of the global batch, each micro-batch's host cost counted as a step's, and
    one compile of the blocks."""
    model = build_model("llada", "real", "meta", torch.bfloat16)
    length = SEQUENCE_LENGTH["real"]
    flops_per_token = training_flops_per_token(model.config, length, linear_weights(model), 0)
    global_batch = read_recipe(recipe_path("llada"))["global_batch_size"]
    probed_rows = 2 * global_batch - 1
    rows = probed_rows + settings.recipe_steps * global_batch
    work = WINDOW.matmul_s(rows * length * flops_per_token)
    host = settings.recipe_steps * global_batch * TRAIN_STEP_HOST_S
    explain["recipe"] = {"flops_per_token": flops_per_token, "rows_of_1024_tokens": rows, "matmul_s": round(work, 1),
                         "host_s": host, "compile_s": COMPILE_S}
    return STARTUP_S + BUILD_S + work + host + COMPILE_S


def decode_seconds(forward_tokens: int, weight_bytes: int, matmul_weights: int) -> float:
    """One forward: the larger of reading every weight and its matmul FLOPs (2 per weight and token)."""
    return max(WINDOW.read_s(weight_bytes), WINDOW.matmul_s(2 * matmul_weights * forward_tokens)) + DECODE_STEP_HOST_S


def decode_budget(settings: Settings, explain: dict) -> float:
    """Per batch and cache mode, ``gen_length`` steps (a random model commits one token a step). No cache forwards
    prompt + generation each step; dual cache the current block, plus a full forward at each block start."""
    model = build_model("llada", "real", "meta", torch.bfloat16)
    weights, matmul = weight_read_bytes(model), linear_weights(model)
    gen, block, prompt = DECODE_GEN_LENGTH["real"], 32, DECODE_PROMPT_TOKENS
    full = prompt + gen
    per_mode = {"none": lambda b: gen * decode_seconds(b * full, weights, matmul),
                "prefix": lambda b: gen * decode_seconds(b * (block + gen // 2), weights, matmul)
                + gen // block * decode_seconds(b * full, weights, matmul),
                "dual": lambda b: gen * decode_seconds(b * block, weights, matmul)
                + gen // block * decode_seconds(b * full, weights, matmul)}
    batches = settings.decode_batches or DECODE_BATCHES["real"]
    compiled = sum(step.endswith(COMPILED) for step in settings.step_modes)
    # A compiled step decodes twice (untimed, to compile and capture; then timed), at batch 1 only, as static does.
    steps_at = {b: sum(1 for step in settings.step_modes if step in ("eager", "graph") or b == batches[0])
                + compiled * (b == batches[0]) for b in batches}
    seconds = {f"{mode}@{b}": per_mode[mode](b) * steps_at[b] for mode in settings.cache_modes for b in batches}
    warm_up = sum(per_mode[mode](1) * block / gen for mode in settings.cache_modes)
    compile_s = compiled * DECODE_COMPILE_S * len(settings.cache_modes)
    explain["decode"] = {"weight_read_bytes": weights, "seconds": {k: round(v, 1) for k, v in seconds.items()},
                         "decodes_per_mode": steps_at, "warm_up_s": round(warm_up, 1), "compile_s": round(compile_s, 1)}
    return STARTUP_S + BUILD_S + warm_up + sum(seconds.values()) + compile_s


def score_budget(settings: Settings, explain: dict) -> float:
    """The scoring time asked for, plus the warm-up batch and the batch that crosses the budget (each at most
    ``max_tokens_per_batch`` tokens of the causal teacher: 2 FLOPs per matmul weight and token)."""
    model = build_model("teacher", "real", "meta", torch.bfloat16)
    tokens = ScoringOptions.max_tokens_per_batch
    batch = WINDOW.matmul_s(2 * linear_weights(model) * tokens)
    explain["score"] = {"batch_tokens": tokens, "batch_s": round(batch, 2), "scoring_s": settings.score_budget_s}
    return STARTUP_S + BUILD_S + settings.score_budget_s + 2 * batch


def zero2_budget(settings: Settings, explain: dict) -> float:
    """``accelerate launch`` (a second process start) and DeepSpeed's set-up dominate: 3 steps of batch 1."""
    explain["zero2"] = {"steps": ZERO2_STEPS, "deepspeed_init_s": DEEPSPEED_INIT_S}
    return 2 * STARTUP_S + BUILD_S + DEEPSPEED_INIT_S + ZERO2_STEPS * 1.0


PARTS = {"tests": lambda settings, explain: TESTS_S + STARTUP_S, "decode": decode_budget, "train": train_budget,
         "recipe": recipe_budget, "score": score_budget, "zero2": zero2_budget}
"""In run_all.sh's order: most important first (correctness, then decoding, training, the recipe as users train,
scoring, ZeRO-2)."""


def budgets(scale: str, settings: Settings = Settings()) -> tuple[dict[str, int], dict]:
    """Whole seconds per part (the slack applied at real scale) and the arithmetic behind them."""
    explain: dict = {"reference": WINDOW.peak.name, "matmul_efficiency": WINDOW.matmul_efficiency,
                     "bandwidth_efficiency": WINDOW.bandwidth_efficiency, "slack": WINDOW.slack}
    if scale == "tiny":
        return dict.fromkeys(PARTS, int(TINY_BUDGET_S)), explain
    return {part: round(WINDOW.budget(estimate(settings, explain))) for part, estimate in PARTS.items()}, explain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=("tiny", "real"), default="real")
    parser.add_argument("--explain-to", type=Path, default=None, help="append the arithmetic as one JSON line to this file")
    parser.add_argument("--decode-batches", default=None, help="the decode part's batches, rising from 1 (e.g. 1)")
    args = parser.parse_args()
    if args.explain_to is not None and (args.explain_to.is_dir() or not args.explain_to.parent.is_dir()):
        parser.error(f"argument --explain-to: {args.explain_to} is a folder or its folder does not exist")
    settings = Settings()
    if args.decode_batches is not None:
        try:
            settings = replace(settings, decode_batches=parse_decode_batches(args.decode_batches))
        except ValueError as error:
            parser.error(f"argument --decode-batches: {args.decode_batches!r}: {error}")
    seconds, explain = budgets(args.scale, settings)
    if args.explain_to:
        with args.explain_to.open("a") as handle:
            handle.write(json.dumps({"budgets_s": seconds, "total_s": sum(seconds.values()), **explain}) + "\n")
    for part, value in seconds.items():
        print(part, value, *settings.flags(part))


if __name__ == "__main__":
    main()
