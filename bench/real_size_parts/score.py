"""bench/real_size.py's score part: the teacher's scoring of s1K-like rows."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
from train_step import synchronize

from real_size_parts.common import (
    MODEL_NAMES,
    SCORE_SECONDS_PER_MILLION_MAX,
    TOKEN_ID_HIGH,
    Run,
    build_model,
    peak_memory,
    reset_peak_memory,
    shape,
)
from trims_hf.data.scoring import EncodedRow, plan_batches
from trims_hf.data.teacher import check_chunked_head, score_rows
from trims_hf.settings import ScoringOptions


@dataclass(frozen=True)
class LengthModel:
    """Log-normal token lengths (median, sigma), clipped to [low, high]."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.clip(np.rint(rng.lognormal(math.log(self.median), self.sigma, count)), self.low, self.high).astype(int)


# Assumed s1K-like lengths in Qwen3 tokens (s1K itself is not reachable offline): questions ~160 tokens, a
# thinking trace plus answer ~3,600 tokens at the median with a long tail (mean ~4,500), capped at 16,384.
S1K_PROMPT = LengthModel(median=160, sigma=0.6, low=16, high=2048)
S1K_COMPLETION = LengthModel(median=3600, sigma=0.7, low=128, high=16384)
TINY_LENGTH_DIVISOR = 32
S1K_ROWS = 1000


def s1k_like_lengths(rows: int, scale: str, seed: int = 0) -> list[tuple[int, int]]:
    """(prompt, completion) token lengths of ``rows`` s1K-like rows; tiny scale divides them by 32."""
    rng = np.random.default_rng(seed)
    divisor = TINY_LENGTH_DIVISOR if scale == "tiny" else 1
    models = [replace(m, median=m.median / divisor, low=max(1, m.low // divisor), high=m.high // divisor)
              for m in (S1K_PROMPT, S1K_COMPLETION)]
    return list(zip(*(m.draw(rng, rows).tolist() for m in models)))


def synthetic_rows(lengths: list[tuple[int, int]], seed: int = 0) -> tuple[list[EncodedRow], list[str]]:
    """Encoded teacher rows of random ids with one character per completion token (spans the scorer validates)."""
    rng = np.random.default_rng(seed)
    rows, completions = [], []
    for index, (prompt, completion) in enumerate(lengths):
        ids = tuple(rng.integers(3, TOKEN_ID_HIGH, prompt + completion).tolist())
        rows.append(EncodedRow(index, ids, prompt, tuple((i, i + 1) for i in range(completion)), False))
        completions.append("x" * completion)
    return rows, completions


PROFILED_BATCHES = 3
"""Batches a ``--profile`` run of the score part scores: enough for the operator table, quick under the profiler."""


def score_part(run: Run) -> None:
    """Times the library's scoring (``score_rows``: forwards, chunked head, per-row checks), as ``trims score`` runs
    it, batch by batch of the planner's batches (in a seeded random order, so a run cut by ``--score-budget-s`` has
    scored a fair sample of lengths), after a warm-up on the largest batch. Stops after the batch that passes the
    budget and extrapolates the whole run and s1K from the tokens/s of the batches scored."""
    model = build_model("teacher", run.scale, run.device, run.dtype, run.attn_implementation).eval()
    check_chunked_head(model)  # what load_teacher checks before scoring
    options = ScoringOptions(max_tokens_per_batch=run.max_tokens_per_batch,
                             logits_chunk_elements=run.logits_chunk_elements)
    lengths = s1k_like_lengths(run.score_rows, run.scale)
    rows, completions = synthetic_rows(lengths)
    planned = plan_batches([len(r.input_ids) for r in rows], options.max_tokens_per_batch)

    def score(batch: list[int]) -> None:
        score_rows(model, [rows[i] for i in batch], [completions[i] for i in batch], options, 0)

    score(planned[0])  # warm-up, largest batch
    order = np.random.default_rng(0).permutation(len(planned))[:PROFILED_BATCHES if run.profile else None]
    reset_peak_memory(run.device)
    synchronize(run.device)
    start = time.perf_counter()
    scored: list[int] = []
    batches = 0
    for index in order.tolist():
        score(planned[index])
        scored, batches = scored + planned[index], batches + 1
        if time.perf_counter() - start > run.score_budget_s:
            break
    synchronize(run.device)
    seconds = time.perf_counter() - start
    tokens = sum(len(rows[i].input_ids) for i in scored)
    planned_tokens = sum(len(r.input_ids) for r in rows)
    tokens_per_s = tokens / seconds
    s1k_seconds = planned_tokens / tokens_per_s * S1K_ROWS / run.score_rows
    run.emit("score", {
        "measurement": "teacher_scoring", "model": MODEL_NAMES["teacher"],
        "shape": shape(model.config, model.num_parameters()),
        "attn_implementation": model.config._attn_implementation, "rows": run.score_rows,
        "lengths": {"prompt": asdict(S1K_PROMPT), "completion": asdict(S1K_COMPLETION),
                    "divided_by": TINY_LENGTH_DIVISOR if run.scale == "tiny" else 1,
                    "source": "assumed s1K-like (s1K not reachable offline)",
                    "prompt_tokens": sum(p for p, _ in lengths), "completion_tokens": sum(c for _, c in lengths),
                    "longest_row": max(p + c for p, c in lengths)},
        "max_tokens_per_batch": options.max_tokens_per_batch,
        "logits_chunk_elements": options.logits_chunk_elements,
        "positions_per_logits_chunk": max(1, options.logits_chunk_elements // model.config.vocab_size),
        "budget_s": run.score_budget_s, "batches_planned": len(planned), "batches_scored": batches,
        "rows_scored": len(scored), "complete": len(scored) == len(rows),
        "teacher_tokens_planned": planned_tokens, "teacher_tokens": tokens, "seconds": round(seconds, 6),
        "tokens_per_s": round(tokens_per_s, 1), **peak_memory(run.device),
        "seconds_per_million_tokens": round(1e6 / tokens_per_s, 2),
        "goal_seconds_per_million_tokens_max": SCORE_SECONDS_PER_MILLION_MAX,
        "s1k_curation_estimate_s": round(s1k_seconds, 3), "s1k_curation_estimate_gpu_hours": round(s1k_seconds / 3600, 4),
        "estimate": "the planned tokens (then 1,000 rows) at the tokens/s of the batches scored",
        "paper_curation_a100_gpu_hours": 0.6, **run.judge(1e6 / tokens_per_s / SCORE_SECONDS_PER_MILLION_MAX),
    })
