"""What trajectory rows teach: how much surer a student is of the future buckets once the context buckets are seen.

A TRIMS trajectory row at bucket threshold k masks the future buckets (``b > k``) heavily and the context buckets
(``b <= k``) lightly, so it trains "the future given the context". If that is what the student learns, a TRIMS student
should gain more than an MDLM one on the future tokens when the context is revealed, compared with everything masked.
A threshold decoder can only exploit what the student learned, so this is read before any decoding result is.

For every row and every k = 0..K-2 the student reads the row twice:

* *context revealed*: every response token of a bucket ``<= k`` visible, every later bucket masked (the trajectory
  row's limit p_context 0, p_future 1; the end-of-response tokens are in the last bucket, so they stay masked);
* *all masked*: every response token masked (the same for every k).

On the future tokens of k it reports the log-probability of the right token and the confidence (the top
probability) in each reading, and the gain, revealed minus all masked. :func:`trajectory_views` and
:func:`token_scores` are pure tensor functions; :func:`measure_future_gain` runs a student over prepared rows.

What the decoder then does with it: :func:`commit_profile` groups the tokens a threshold decoder committed by their
teacher bucket, with how many steps into its block each was committed and the model's confidence at that moment;
:func:`decode_commit_profile` decodes problems to get them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..data import schema
from ..data.buckets import threshold_buckets
from .analysis import steps_into_block

READINGS = ("revealed", "masked")
"""The two reads of a row: the context buckets visible, or every completion token masked."""
SCORES = ("logprob", "confidence")
"""What is read on a future token: the log-probability of the right token, and the top probability."""


def trajectory_views(input_ids: torch.Tensor, response: torch.Tensor, read: torch.Tensor, bucket_ids: torch.Tensor,
                     thresholds: Sequence[int], mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's reads: ``[len(thresholds) + 1, L]`` token ids (at each threshold k every response token of a bucket
    above k masked, then every response token masked) and ``[len(thresholds), L]`` bool, the future tokens of each
    threshold that are read.

    ``input_ids`` ``[L]``; ``response`` ``[L]`` bool, the positions a trajectory row may mask (the completion and the
    end-of-response tokens, which sit in the last bucket, future at every threshold as in training); ``read`` ``[L]``
    bool, the positions scored (the completion tokens); ``bucket_ids`` ``[L]`` (any value outside ``response``).
    """
    k = torch.as_tensor(list(thresholds), dtype=bucket_ids.dtype, device=bucket_ids.device)
    hidden = response[None, :] & (bucket_ids[None, :] > k[:, None])  # [T, L]
    masked = torch.cat([hidden, response[None, :]])  # [T + 1, L]
    views = torch.where(masked, torch.full_like(input_ids, mask_token_id), input_ids[None, :].expand_as(masked))
    return views, hidden & read[None, :]


def token_scores(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``targets`` and the top probability at every position: ``logits`` ``[..., L, V]`` (aligned:
    position i predicts token i), ``targets`` ``[..., L]``; both results ``[..., L]`` in float32."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(-1, targets[..., None]).squeeze(-1), logprobs.max(-1).values.exp()


@dataclass
class FutureGain:
    """The readings of one student on a set of rows: pooled over every (row, threshold, future token), per threshold,
    and per row (a row's mean over its (threshold, future token) pairs, for intervals over rows)."""

    thresholds: list[int]
    pooled: dict[str, float] = field(default_factory=dict)
    """``revealed_logprob``, ``masked_logprob``, ``gain_logprob`` and the same for ``confidence``; ``tokens``."""
    per_threshold: list[dict[str, float]] = field(default_factory=list)
    per_row: list[dict[str, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"thresholds": self.thresholds, "pooled": self.pooled, "per_threshold": self.per_threshold,
                "per_row": self.per_row}


def summarise(sums: Mapping[str, float], tokens: float) -> dict[str, float]:
    """Means of summed readings, and the gains (revealed minus masked)."""
    means = {name: sums[name] / tokens if tokens else float("nan") for name in sums}
    for score in SCORES:
        means[f"gain_{score}"] = means[f"revealed_{score}"] - means[f"masked_{score}"]
    return {**means, "tokens": tokens}


def measure_future_gain(model: Any, rows: Sequence[Mapping[str, Any]], num_buckets: int) -> FutureGain:
    """:class:`FutureGain` of ``model`` (a student from :func:`trims_hf.load_student` / ``prepare_student``) on
    prepared rows (``input_ids``, ``prompt_length``, ``bucket_ids`` and ``student_score``, from
    :func:`trims_hf.prepare_dataset` on scored rows): one forward of ``num_buckets`` reads per row.

    Only completion tokens are scored (``student_score``'s length); the end-of-response tokens are masked with the
    last bucket, as a trajectory row masks them, but not scored: they would count as future at every threshold.
    """
    from ..students import mask_token_id, student_logits

    mask = mask_token_id(model)
    device = next(model.parameters()).device
    thresholds = list(range(num_buckets - 1))
    names = [f"{reading}_{score}" for reading in READINGS for score in SCORES]
    pooled = dict.fromkeys(names, 0.0)
    per_k = [dict.fromkeys(names, 0.0) for _ in thresholds]
    per_k_tokens = [0.0 for _ in thresholds]
    per_row = []
    for index, row in enumerate(rows):
        if schema.BUCKET_IDS not in row:
            raise schema.SchemaError(f"row {index}: no '{schema.BUCKET_IDS}': prepare scored rows for the student first.")
        ids = torch.as_tensor(row[schema.INPUT_IDS])
        start, kept = int(row[schema.PROMPT_LENGTH]), len(row[schema.STUDENT_SCORE])
        response_buckets = torch.as_tensor(row[schema.BUCKET_IDS], dtype=ids.dtype)  # completion, then end tokens
        buckets = torch.full_like(ids, -1)
        buckets[start:start + len(response_buckets)] = response_buckets
        response, completion = torch.zeros_like(ids, dtype=torch.bool), torch.zeros_like(ids, dtype=torch.bool)
        response[start:start + len(response_buckets)] = True
        completion[start:start + kept] = True
        views, future = trajectory_views(ids, response, completion, buckets, thresholds, mask)
        with torch.no_grad():
            logits = student_logits(model, views.to(device)).cpu()
        logprob, confidence = token_scores(logits, ids[None, :].expand_as(views))
        read = {"revealed_logprob": logprob[:-1], "revealed_confidence": confidence[:-1],
                "masked_logprob": logprob[-1:].expand_as(future), "masked_confidence": confidence[-1:].expand_as(future)}
        row_sums = dict.fromkeys(names, 0.0)
        for k in thresholds:
            per_k_tokens[k] += float(future[k].sum())
            for name in names:
                value = float(read[name][k][future[k]].sum())
                per_k[k][name] += value
                row_sums[name] += value
        tokens = float(future.sum())
        for name in names:
            pooled[name] += row_sums[name]
        per_row.append(summarise(row_sums, tokens))
    return FutureGain(thresholds, summarise(pooled, sum(per_k_tokens)),
                      [summarise(sums, n) for sums, n in zip(per_k, per_k_tokens)], per_row)


def commit_profile(nll: np.ndarray, lateness: np.ndarray, confidence: np.ndarray, thresholds: np.ndarray,
                   num_buckets: int) -> list[dict[str, float]]:
    """Per hard-to-easy bucket (bucket 0 the hardest, by ``thresholds`` from :func:`trims_hf.data.buckets.bucket_rows`) of
    committed tokens with teacher NLL ``nll``: how many, their mean ``lateness`` (steps into their block) and mean
    ``confidence`` at commit (NaN ones, EOS fills, left out). A decoder that commits hard tokens first shows lateness
    rising with the bucket."""
    scored = ~np.isnan(nll)  # a response the teacher could not score (blank text) has no bucket
    nll, lateness, confidence = nll[scored], lateness[scored], confidence[scored]
    buckets = threshold_buckets(nll, thresholds, "hard_to_easy")
    profile = []
    for k in range(num_buckets):
        here = buckets == k
        known = here & ~np.isnan(confidence)
        profile.append({"bucket": k, "tokens": int(here.sum()),
                        "lateness": float(lateness[here].mean()) if here.any() else float("nan"),
                        "confidence": float(confidence[known].mean()) if known.any() else float("nan")})
    return profile


def decode_commit_profile(model: Any, tokenizer: Any, task: Any, decoding: Any, teacher: tuple[Any, Any],
                          max_length: int, thresholds: np.ndarray, num_buckets: int) -> list[dict[str, float]]:
    """:func:`commit_profile` of the tokens ``model`` commits on every problem of ``task`` with ``decoding`` (a
    :class:`~trims_hf.settings.DecodingConfig`), each answer token's NLL from ``teacher`` (model, tokenizer) as
    ``trims score`` computes it. Answers the teacher cuts into other tokens than the student's are left out."""
    from ..evaluation.evaluate import evaluate_task
    from ..generation import TrajectoryRecorder
    from .analysis import TeacherNLL

    recorder = TrajectoryRecorder()
    evaluate_task(model, tokenizer, task, decoding, batch_size=len(task.load()), hooks=[recorder])
    prompts = {example.id: task.plain_text(task.messages(example)) for example in task.load()}
    scores = TeacherNLL(*teacher, tokenizer, max_length)
    nll, lateness, confidence = [], [], []
    for trajectory in recorder.trajectories:
        answer = trajectory.partial_response(int(trajectory.commit_step.max()))
        teacher_nll = scores.scorer(prompts[trajectory.sample_id])(answer).double().numpy()
        if len(answer) == 0 or len(teacher_nll) != len(answer):
            continue
        nll.append(teacher_nll)
        lateness.append(steps_into_block(trajectory.commit_step.double().numpy(), decoding.block_length)[: len(answer)])
        confidence.append(trajectory.commit_confidence[: len(answer)].numpy())
    if not nll:
        return commit_profile(np.zeros(0), np.zeros(0), np.zeros(0), thresholds, num_buckets)
    return commit_profile(*(np.concatenate(part) for part in (nll, lateness, confidence)), thresholds, num_buckets)


__all__ = ["FutureGain", "READINGS", "SCORES", "commit_profile", "decode_commit_profile", "measure_future_gain",
           "token_scores", "trajectory_views"]
