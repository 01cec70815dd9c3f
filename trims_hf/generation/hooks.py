"""Decoder hooks: what the decoder reports each step, and the recorders built on it.

The decoder knows nothing of tasks; measurements that need task knowledge (where a stop string ends an
answer, what the teacher says about a partial answer) enter through callables given to the recorders.

NFE accounting (one rule everywhere): the batch's model-call count is ``model_forwards``; a sample is
*charged* one forward for every call in which its current block still had masked positions. A sample
that waits while others finish the block is not charged, so per-sample NFE does not depend on the batch
it ran in and equals its batch-size-1 NFE. Tokens per step is the ratio of totals
``sum(counted tokens) / sum(charged forwards)`` over the evaluation, not a mean of per-sample ratios.

Two token counts share that denominator: ours (``tokens_per_step``: tokens before the first stop token or task stop
string; the recorder knows the stop strings, and every result is built from its counts) and the count of the Fast-dLLM /
dParallel / d3LLM evaluation scripts (``tokens_per_forward_non_eos``: every response token that is not EOS, up to a task
stop string, so the end-of-turn token and, with early stop off, non-EOS tokens after it count too).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedTokenizerBase

from .steps import tokens_before_stop

if TYPE_CHECKING:
    from ..settings import DecodingConfig
    from .steps import GenerationOutput


@dataclass(frozen=True)
class GenerationStart:
    """What hooks learn before the first step of one :func:`generate` call."""

    batch_size: int
    prompt_length: int
    """Padded prompt length; response position ``j`` is sequence position ``prompt_length + j``."""
    config: DecodingConfig
    stop_token_ids: tuple[int, ...]
    eos_token_id: int | None
    sample_ids: tuple[Hashable, ...] | None


@dataclass(frozen=True)
class StepRecord:
    """One decoding step (= one model call) of a batch. Tensors are over response positions ``[B, G]``."""

    step: int
    """Model-call index within this generate call."""
    block: int
    charged: torch.Tensor
    """bool ``[B]``: samples charged for this forward (their block still had masks)."""
    sample_steps: torch.Tensor
    """long ``[B]``: each sample's charged forwards so far, this one included."""
    committed: torch.Tensor
    """bool ``[B, G]``: positions the strategy committed at this step."""
    confidences: torch.Tensor
    """float64 ``[B, G]``: model probability of each committed token (NaN elsewhere)."""
    filled: torch.Tensor
    """bool ``[B, G]``: positions early stop set to EOS at this step (after the first stop token, once the
    block holding it has no masks left)."""
    tokens: torch.Tensor
    """long ``[B, G]``: the response after this step (mask id where still masked)."""

    def commits(self, sample: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Response positions, tokens and confidences committed for ``sample`` at this step."""
        positions = self.committed[sample].nonzero().squeeze(-1)
        return positions, self.tokens[sample, positions], self.confidences[sample, positions]


class DecodeHook:
    """Base class for decoder hooks; override any of the three callbacks."""

    def on_start(self, start: GenerationStart) -> None:
        """Called once per :func:`generate` call, before the first forward."""

    def on_step(self, record: StepRecord) -> None:
        """Called after every model call, once the step's commits are applied."""

    def on_end(self, output: GenerationOutput) -> None:
        """Called with the finished batch."""


def non_eos_tokens(responses: torch.Tensor, eos_token_id: int | None) -> torch.Tensor:
    """Per row, the number of tokens that are not EOS (the peers' count of generated tokens)."""
    return (responses != eos_token_id).sum(dim=1) if eos_token_id is not None else torch.full(
        responses.shape[:1], responses.shape[1], device=responses.device
    )


def cut_at_stop_strings(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest stop string."""
    cuts = [index for stop in stop_strings if (index := text.find(stop)) >= 0]
    return text[: min(cuts)] if cuts else text


def tokens_covering(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], num_chars: int) -> int:
    """Fewest leading tokens of ``ids`` whose decoded text reaches ``num_chars`` characters.

    A token straddling a stop string counts (it produced text before it); decoding prefixes instead of
    re-tokenising the cut text keeps the model's own token boundaries.
    """
    return bisect.bisect_left(
        range(len(ids) + 1), num_chars, key=lambda n: len(tokenizer.decode(ids[:n], skip_special_tokens=True))
    )


def answer_text(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], stop_strings: Sequence[str] = ()) -> tuple[str, int]:
    """The answer a response gives and the tokens it took: ``ids`` (already cut before the first stop token)
    decoded, then cut before the earliest stop string, with the number of leading tokens that text needs."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    answer = cut_at_stop_strings(text, stop_strings)
    return answer, len(ids) if answer == text else tokens_covering(tokenizer, ids, len(answer))


def throughput(tokens: int, non_eos_tokens: int, nfe: int, seconds: float) -> dict[str, float]:
    """Tokens per step and its peers' count, each a ratio of totals over the charged forwards, and tokens per second."""
    return {
        "tokens_per_step": tokens / nfe if nfe else 0.0,
        "tokens_per_forward_non_eos": non_eos_tokens / nfe if nfe else 0.0,
        "tokens_per_second": tokens / seconds if seconds else 0.0,
    }


class TokensPerStepRecorder(DecodeHook):
    """Tokens per step (the paper's "TPS"), tokens per second and NFE over a whole evaluation.

    A sample's counted tokens are those of its answer: the tokens before its first stop token (EOS tail
    excluded), cut before the earliest of ``stop_strings`` (a task's, or a harness request's ``until``; decoding
    them needs the ``tokenizer``). Its non-EOS tokens are every response token that is not EOS, except that a stop
    string cutting the answer before the first stop token ends both counts there. With a tokenizer, the answers
    themselves are kept in :attr:`answers`.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None = None, stop_strings: Sequence[str] = ()) -> None:
        if stop_strings and tokenizer is None:
            raise ValueError("cutting answers at stop strings needs the tokenizer")
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.samples: dict[Hashable, dict[str, int]] = {}
        self.answers: dict[Hashable, str] = {}
        self.model_forwards = 0
        self.wall_time_s = 0.0
        self.early_stop: bool | None = None
        self._start: GenerationStart | None = None
        self._clock = 0.0

    def on_start(self, start: GenerationStart) -> None:
        self._start = start
        self.early_stop = start.config.early_stop
        self._clock = time.perf_counter()

    def on_end(self, output: GenerationOutput) -> None:
        self.wall_time_s += time.perf_counter() - self._clock
        self.model_forwards += output.nfe
        start = self._start
        ids = start.sample_ids or tuple(range(len(self.samples), len(self.samples) + start.batch_size))
        lengths = tokens_before_stop(output.responses, start.stop_token_ids).tolist()
        non_eos = non_eos_tokens(output.responses, start.eos_token_id).tolist()
        for sample_id, row, length, others, nfe in zip(ids, output.responses.tolist(), lengths, non_eos,
                                                       output.sample_nfe.tolist()):
            if sample_id in self.samples:
                raise ValueError(f"Sample id {sample_id!r} was recorded twice.")
            if self.tokenizer is not None:
                self.answers[sample_id], counted = answer_text(self.tokenizer, row[:length], self.stop_strings)
                others = counted if counted < length else others
                length = counted
            self.samples[sample_id] = {"tokens": int(length), "non_eos_tokens": int(others), "nfe": int(nfe)}

    def per_sample(self) -> dict[Hashable, dict[str, float]]:
        """Counted tokens, charged NFE and their ratio for every sample (diagnostics only)."""
        return {key: {**value, "tokens_per_step": throughput(value["tokens"], 0, value["nfe"], 0)["tokens_per_step"]}
                for key, value in self.samples.items()}

    def summary(self) -> dict[str, Any]:
        """Evaluation totals; ``tokens_per_step`` and ``tokens_per_forward_non_eos`` are ratios of totals."""
        tokens = sum(value["tokens"] for value in self.samples.values())
        non_eos = sum(value["non_eos_tokens"] for value in self.samples.values())
        nfe = sum(value["nfe"] for value in self.samples.values())
        return {
            **throughput(tokens, non_eos, nfe, self.wall_time_s),
            "non_eos_tokens": non_eos,
            "nfe": nfe,
            "model_forwards": self.model_forwards,
            "generated_tokens": tokens,
            "samples": len(self.samples),
            "wall_time_s": self.wall_time_s,
            "early_stop": self.early_stop,
        }


@dataclass(frozen=True)
class Trajectory:
    """How one sample's response was decoded; step indices are the sample's own charged forwards (0-based)."""

    sample_id: Hashable
    commit_step: torch.Tensor
    """long ``[G]``: step at which each position first received a token (strategy or EOS fill)."""
    commit_token: torch.Tensor
    """long ``[G]``: the token given at that step."""
    fill_step: torch.Tensor
    """long ``[G]``: step at which early stop set the position to EOS, -1 if never."""
    stop_token_ids: tuple[int, ...]
    commit_confidence: torch.Tensor | None = None
    """float64 ``[G]``: the model's probability of the token when the strategy committed it (NaN for EOS fill)."""

    def partial_response(self, step: int) -> torch.Tensor:
        """Tokens visible after ``step``, in position order, masks dropped, cut before the first stop token."""
        visible = (self.commit_step <= step) & ~((self.fill_step >= 0) & (self.fill_step <= step))
        tokens = self.commit_token[visible]
        return tokens[: int(tokens_before_stop(tokens[None], self.stop_token_ids)[0])]


class TrajectoryRecorder(DecodeHook):
    """Records the decode order of every generated position (for heatmaps and Figure 7 analyses)."""

    def __init__(self) -> None:
        self.trajectories: list[Trajectory] = []
        self._start: GenerationStart | None = None
        self._step: torch.Tensor | None = None
        self._token: torch.Tensor | None = None
        self._fill: torch.Tensor | None = None
        self._confidence: torch.Tensor | None = None

    def on_start(self, start: GenerationStart) -> None:
        self._start = start
        shape = (start.batch_size, start.config.gen_length)
        self._step = torch.full(shape, -1, dtype=torch.long)
        self._token = torch.full(shape, -1, dtype=torch.long)
        self._fill = torch.full(shape, -1, dtype=torch.long)
        self._confidence = torch.full(shape, torch.nan, dtype=torch.float64)

    def on_step(self, record: StepRecord) -> None:
        step = (record.sample_steps - 1).cpu()[:, None].expand_as(self._step)
        committed, filled = record.committed.cpu(), record.filled.cpu()
        first = (committed | filled) & (self._step < 0)
        self._step = torch.where(first, step, self._step)
        self._token = torch.where(first, record.tokens.cpu(), self._token)
        self._confidence = torch.where(first & committed, record.confidences.cpu().double(), self._confidence)
        self._fill = torch.where(filled, step, self._fill)

    def on_end(self, output: GenerationOutput) -> None:
        start = self._start
        ids = start.sample_ids or tuple(range(len(self.trajectories), len(self.trajectories) + start.batch_size))
        for row, sample_id in enumerate(ids):
            self.trajectories.append(
                Trajectory(sample_id, self._step[row], self._token[row], self._fill[row], start.stop_token_ids,
                           self._confidence[row])
            )

    def decode_order(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``[N, G]`` decode steps (-1 pads shorter generations) and the ``[N, G]`` EOS-fill mask."""
        width = max(t.commit_step.numel() for t in self.trajectories)
        steps = torch.full((len(self.trajectories), width), -1, dtype=torch.long)
        filled = torch.zeros_like(steps, dtype=torch.bool)
        for row, trajectory in enumerate(self.trajectories):
            steps[row, : trajectory.commit_step.numel()] = trajectory.commit_step
            filled[row, : trajectory.fill_step.numel()] = trajectory.fill_step >= 0
        return steps, filled


def teacher_nll_per_step(trajectory: Trajectory, score: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Teacher NLL of the partially decoded response after every step (the paper's Figure 7).

    Definition: after step ``s`` the partial response is the tokens committed so far, in position order,
    with still-masked positions dropped and everything from the first stop token on removed
    (:meth:`Trajectory.partial_response`). ``score(ids)`` returns the teacher's per-token NLL of those ids
    as an answer to the sample's prompt (teacher forcing; the caller binds the prompt and handles the
    teacher's tokenizer). The value at step ``s`` is the mean per-token NLL, NaN while nothing is visible.
    """
    steps = int(trajectory.commit_step.max()) + 1
    values = torch.full((steps,), float("nan"), dtype=torch.float64)
    for step in range(steps):
        partial = trajectory.partial_response(step)
        if partial.numel():
            values[step] = score(partial).double().mean()
    return values
