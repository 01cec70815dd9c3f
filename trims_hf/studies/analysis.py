"""Analyses of a TRIMS run that users can repeat on their own runs: decode order against teacher difficulty,
how teacher NLL spreads over the buckets, and mean and spread of evaluation results over seeds.

Everything here is a pure function of scores, trajectories or results, except :class:`TeacherNLL` and
:func:`teacher_nll_scorer`, which bind a teacher to the library's scorer so :func:`hard_first_correlation` and
:func:`~trims_hf.generation.hooks.teacher_nll_per_step` can score a student's partial responses.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..data.scoring import plan_batches
from ..data.teacher import encode_row, score_batch
from ..generation.hooks import Trajectory
from ..reports import markdown_table
from ..settings import ScoringOptions

if TYPE_CHECKING:
    from ..evaluation.evaluate import EvalResult


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """0-based ranks of ``values``, ties sharing the mean of their ranks (what Spearman's rho needs)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return (np.bincount(inverse, weights=ranks) / counts)[inverse]


def spearman_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (Pearson's on tie-averaged ranks); NaN when either side is constant, holds a NaN
    or has fewer than two values.

    Written in numpy because scipy is not a dependency; equals ``scipy.stats.spearmanr(x, y).statistic``.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"spearman_correlation: {len(x)} and {len(y)} values; pair each x with one y.")
    if len(x) < 2 or np.isnan(x).any() or np.isnan(y).any():
        return math.nan
    x_ranks, y_ranks = _average_ranks(x), _average_ranks(y)
    if x_ranks.std() == 0 or y_ranks.std() == 0:
        return math.nan
    return float(np.corrcoef(x_ranks, y_ranks)[0, 1])


def steps_into_block(commit_steps: np.ndarray, block_length: int) -> np.ndarray:
    """Per position, how many steps after the first commit among ``commit_steps`` of its block it was committed.

    Blocks are decoded one after another, so the raw step mostly says which block a token is in; the
    lateness within the block is what shows the order the model chose.
    """
    blocks = np.arange(len(commit_steps)) // block_length
    first = np.minimum.reduceat(commit_steps, np.arange(0, len(commit_steps), block_length))
    return commit_steps - first[blocks]


SPEARMAN_LABEL = ("Spearman(teacher NLL of an answer token, steps into its block before it was committed, counted from "
                  "the block's first answer token)")
"""How the reports name :func:`hard_first_correlation`."""


def hard_first_correlation(trajectory: Trajectory, score: Callable[[torch.Tensor], torch.Tensor], block_length: int) -> float:
    """Spearman correlation between each answer token's teacher NLL and how many steps into its block it was
    committed: negative when the model decodes hard tokens first (what TRIMS hard-to-easy teaches).

    The steps are counted among the answer's tokens: in the block where the answer ends, from the first answer token
    committed there, not from an end-of-response fill committed before it (which
    :func:`trims_hf.studies.mechanism.decode_commit_profile` counts from). The studies registered both readings so;
    they differ in that one block only (docs/decisions.md).

    NaN when the teacher's tokens are not the student's (another tokenizer), the answer is shorter than
    three tokens, or nothing varies.
    """
    answer = trajectory.partial_response(int(trajectory.commit_step.max()))
    nll = score(answer).double().numpy()
    if len(answer) < 3 or len(nll) != len(answer):
        return math.nan
    steps = trajectory.commit_step[: len(answer)].double().numpy()
    return spearman_correlation(nll, steps_into_block(steps, block_length))


class TeacherNLL:
    """Teacher NLL of (partial) responses to prompts, through ``trims score``'s encoding and forward (chat template,
    teacher forcing), so the numbers match the scored data set's.

    Why a class: a trace asks for one score per decoding step, and one batch-1 teacher forward each was most of a
    traced evaluation's time. :meth:`prefetch` scores many responses in padded, length-sorted batches (position
    ids count real tokens only, so padding changes no score beyond float rounding), each distinct text once; the
    scorers of :meth:`scorer` then read the stored numbers.
    """

    def __init__(self, teacher: PreTrainedModel, teacher_tokenizer: PreTrainedTokenizerBase,
                 student_tokenizer: PreTrainedTokenizerBase, max_length: int) -> None:
        self.teacher, self.teacher_tokenizer, self.student_tokenizer = teacher, teacher_tokenizer, student_tokenizer
        self.max_length, self.options = max_length, ScoringOptions(teacher_max_length=max_length)
        self.scores: dict[tuple[str, str], torch.Tensor] = {}
        self.forwards = 0

    def text(self, ids: torch.Tensor) -> str:
        return self.student_tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    def prefetch(self, requests: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Score every ``(prompt, student ids)`` not scored yet, many rows per teacher forward."""
        todo = list(dict.fromkeys(key for prompt, ids in requests
                                  if (key := (prompt, self.text(ids))) not in self.scores and key[1].strip()))
        rows = [encode_row({"prompt": prompt, "completion": text}, 0, self.teacher_tokenizer, self.options,
                           self.max_length) for prompt, text in todo]
        with torch.inference_mode():
            for batch in plan_batches([len(row.input_ids) for row in rows], self.options.max_tokens_per_batch):
                scored = score_batch(self.teacher, [rows[i] for i in batch], self.options, pad_token_id=0)
                self.forwards += 1
                self.scores.update((todo[i], torch.from_numpy(nll)) for i, (nll, _) in zip(batch, scored))

    def scorer(self, prompt: str) -> Callable[[torch.Tensor], torch.Tensor]:
        """``score(student_ids) -> per-teacher-token NLL`` of a response to ``prompt`` (``[nan]`` when empty)."""

        def score(ids: torch.Tensor) -> torch.Tensor:
            text = self.text(ids)
            if not text.strip():
                return torch.tensor([math.nan])
            self.prefetch([(prompt, ids)])
            return self.scores[(prompt, text)]

        return score


def teacher_nll_scorer(
    teacher: PreTrainedModel,
    teacher_tokenizer: PreTrainedTokenizerBase,
    student_tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    max_length: int,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``score(student_ids) -> per-teacher-token NLL`` of a (partial) response to ``prompt``, for
    :func:`~trims_hf.generation.hooks.teacher_nll_per_step` and :func:`hard_first_correlation` (one
    :class:`TeacherNLL`'s scorer). An empty response scores ``[nan]``.
    """
    return TeacherNLL(teacher, teacher_tokenizer, student_tokenizer, max_length).scorer(prompt)


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def study_rows(results: Sequence[tuple[int | None, EvalResult]], baseline: str = "MDLM",
               baselines: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Per model and threshold: mean, population std and min-max over seeds of accuracy and tokens per step,
    and the tokens-per-step ratio to ``baseline`` (mean over seeds of the per-seed ratio, so a seed is only
    compared with the baseline trained with the same seed) and in how many of the compared seeds the model's tokens
    per step are above the baseline's (a mean ratio can hide one large seed). ``baselines`` names another baseline for some
    models (e.g. a longer-trained TRIMS variant against the MDLM trained as long).

    ``results`` are ``(seed, result)`` pairs of the confidence-threshold strategy; seed ``None`` marks a model
    without a training seed (e.g. the shared base), which counts as one run.
    """
    if any(result.decoding["strategy"] != "threshold" for _, result in results):
        raise ValueError("study_rows groups by confidence threshold; pass results of the 'threshold' strategy only.")
    groups = results_by_seed(results)
    rows = []
    for (model, tau), by_seed in groups.items():
        reference = groups.get(((baselines or {}).get(model, baseline), tau), {})
        ratios = [tokens_per_step_ratio(r, reference[s], s) for s, r in by_seed.items() if s in reference]
        rows.append({"model": model, "threshold": tau, "seeds": [s for s in by_seed if s is not None],
                     "accuracy": _spread([r.accuracy for r in by_seed.values()]),
                     "tokens_per_step": _spread([r.tokens_per_step for r in by_seed.values()]),
                     "tokens_per_step_vs_mdlm": statistics.fmean(ratios) if ratios else None,
                     "seeds_above_mdlm": (None if model == (baselines or {}).get(model, baseline)
                                          else [sum(ratio > 1 for ratio in ratios), len(ratios)])})
    return rows


def results_by_seed(results: Sequence[tuple[int | None, EvalResult]]) -> dict[tuple[str, float], dict[int | None, EvalResult]]:
    """``(seed, result)`` pairs grouped by (model, threshold), then seed; a second result of the same model, threshold
    and seed, or a model with runs both with and without a seed, is refused: either would silently change a mean."""
    groups: dict[tuple[str, float], dict[int | None, EvalResult]] = {}
    for seed, result in results:
        key = (result.model, result.decoding["threshold"])
        by_seed = groups.setdefault(key, {})
        if seed in by_seed:
            raise ValueError(f"{result.model} at threshold {key[1]}, seed {seed}: two results; pass each run once.")
        if by_seed and (seed is None) != (None in by_seed):
            raise ValueError(f"{result.model} at threshold {key[1]}: runs with and without a seed; a model's runs are "
                             "all seeded or one seedless run.")
        by_seed[seed] = result
    return groups


def tokens_per_step_ratio(result: EvalResult, reference: EvalResult, seed: int | None) -> float:
    """``result``'s tokens per step over ``reference``'s; an error naming the reference when it decoded no step."""
    if not reference.tokens_per_step > 0:
        raise ValueError(f"{reference.model} at threshold {reference.decoding['threshold']}, seed {seed}: tokens per "
                         f"step {reference.tokens_per_step} (no step decoded); no ratio to it.")
    return result.tokens_per_step / reference.tokens_per_step


def format_study(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of :func:`study_rows`: mean ± std (min-max) over seeds."""
    headers = ["Model", "tau", "seeds", "Acc (%) mean ± std (min-max)", "Tokens/step mean ± std (min-max)",
               "Tokens/step vs MDLM"]
    cells = []
    for row in rows:
        acc, tps, ratio = row["accuracy"], row["tokens_per_step"], row["tokens_per_step_vs_mdlm"]
        cells.append([
            str(row["model"]), str(row["threshold"]), str(len(row["seeds"]) or 1),
            f"{100 * acc['mean']:.1f} ± {100 * acc['std']:.1f} ({100 * acc['min']:.0f}-{100 * acc['max']:.0f})",
            f"{tps['mean']:.2f} ± {tps['std']:.2f} ({tps['min']:.2f}-{tps['max']:.2f})",
            "-" if ratio is None else f"{ratio:.2f}x" + ("" if row["seeds_above_mdlm"] is None else
                                                         " (above in {} of {})".format(*row["seeds_above_mdlm"])),
        ])
    return markdown_table(headers, cells)
