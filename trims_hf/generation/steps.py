"""The decoding steps both decoders share (:mod:`.decoding`, full attention; :mod:`.block_causal`, block diffusion):
the commit rules (:class:`Strategy` and its subclasses), a step's proposals (:func:`propose`), the early-stop fill
(:func:`early_stop_fill`, :func:`tokens_before_stop`) and the decoders' :class:`GenerationOutput`.

Pure tensor functions, in their own module so that neither decoder imports the other's internals.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from ..settings import DecodingConfig


def tokens_before_stop(responses: torch.Tensor, stop_token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Per row, the number of tokens before the first stop token (the whole row if there is none)."""
    stops = torch.as_tensor(stop_token_ids, dtype=responses.dtype, device=responses.device)
    is_stop = torch.isin(responses, stops)
    return torch.where(is_stop.any(dim=1), is_stop.int().argmax(dim=1), responses.shape[1])



def _ranks(priority: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Rank of every candidate in its row by descending priority (0 = best); non-candidates rank last."""
    keyed = priority.masked_fill(~candidates, float("-inf"))
    order = keyed.argsort(dim=1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    return ranks.masked_fill(~candidates, order.shape[1])


class Strategy(ABC):
    """Chooses which masked positions of the current block to commit at a step.

    ``scores`` are ``[B, L]`` float64 over the block (confidences or entropies, see ``score``),
    ``candidates`` the still-masked positions, ``step`` the step index inside the block and ``initial``
    the number of masks each row had when the block started. :meth:`select` adds the best candidate of
    every row to whatever the rule picked.
    """

    score: ClassVar[Literal["confidence", "entropy"]] = "confidence"
    tempered: ClassVar[bool] = False
    """Whether at ``temperature > 0`` the confidence scored is the proposal's probability under the tempered
    distribution it was sampled from (LLaDA 2.x's rule) rather than under the model's."""

    @abstractmethod
    def choose(self, scores: torch.Tensor, candidates: torch.Tensor, step: int, initial: torch.Tensor) -> torch.Tensor:
        """The rule itself: a bool ``[B, L]`` commit mask (may be empty)."""

    def priority(self, scores: torch.Tensor) -> torch.Tensor:
        """Higher is committed first."""
        return -scores if self.score == "entropy" else scores

    def select(self, scores: torch.Tensor, candidates: torch.Tensor, step: int, initial: torch.Tensor) -> torch.Tensor:
        best = _ranks(self.priority(scores), candidates) == 0
        return candidates & (self.choose(scores, candidates, step, initial) | best)


@dataclass(frozen=True)
class ConfidenceThreshold(Strategy):
    """Fast-dLLM: commit every candidate whose confidence is >= ``tau``."""

    tau: float = 0.9

    def choose(self, scores, candidates, step, initial):
        return scores >= self.tau


@dataclass(frozen=True)
class ConfidenceFactor(Strategy):
    """Fast-dLLM factor rule: with confidences sorted descending, commit the largest ``n`` such that
    ``(n + 1) * (1 - c(n)) <= factor``."""

    factor: float = 1.0

    def choose(self, scores, candidates, step, initial):
        ranks = _ranks(scores, candidates)
        ordered = scores.masked_fill(~candidates, 0.0).sort(dim=1, descending=True).values
        n = torch.arange(1, scores.shape[1] + 1, device=scores.device, dtype=scores.dtype)
        holds = ((n + 1) * (1 - ordered) <= self.factor).long().cumprod(dim=1)
        return ranks < holds.sum(dim=1, keepdim=True)


@dataclass(frozen=True)
class EntropyThreshold(Strategy):
    """dParallel / d3LLM: commit every candidate whose predictive entropy (nats) is <= ``threshold``."""

    threshold: float = 0.5
    score: ClassVar[Literal["confidence", "entropy"]] = "entropy"

    def choose(self, scores, candidates, step, initial):
        return scores <= self.threshold


@dataclass(frozen=True)
class ThresholdQuota(Strategy):
    """LLaDA 2.x (its ``generate`` and dLLM's ``LLaDA2Sampler``): every candidate whose confidence is > ``tau``,
    and at least the step's quota, the most confident (``block_length`` split as evenly as possible over
    ``steps_per_block`` steps, one more for the first ``block_length % steps_per_block``). The original commits
    the above-threshold ones when they reach the quota and the quota's best otherwise: the same union. At
    ``temperature > 0`` the confidence is, as in the original's ``_sample_with_temperature_topk_topp``, the sampled
    token's probability after dividing the logits by the temperature."""

    tau: float
    steps_per_block: int
    block_length: int
    tempered: ClassVar[bool] = True

    def choose(self, scores, candidates, step, initial):
        quota = self.block_length // self.steps_per_block + int(step < self.block_length % self.steps_per_block)
        return (scores > self.tau) | (_ranks(scores, candidates) < quota)


@dataclass(frozen=True)
class FixedSteps(Strategy):
    """LLaDA low-confidence remasking: ``steps_per_block`` steps share a block's masks as evenly as
    possible (``m // s`` each, one more for the first ``m % s`` steps); each commits its most confident."""

    steps_per_block: int

    def choose(self, scores, candidates, step, initial):
        quota = initial // self.steps_per_block + (step < initial % self.steps_per_block).long()
        return _ranks(scores, candidates) < quota[:, None]


# One builder per name of :data:`trims_hf.settings.StrategyName` (a test checks they match).
STRATEGIES: dict[str, Callable[[DecodingConfig], Strategy]] = {
    "threshold": lambda config: ConfidenceThreshold(config.threshold),
    "factor": lambda config: ConfidenceFactor(config.factor),
    "entropy": lambda config: EntropyThreshold(config.entropy_threshold),
    "fixed_steps": lambda config: FixedSteps(config.total_steps // config.num_blocks),
    "threshold_quota": lambda config: ThresholdQuota(config.threshold, config.total_steps // config.num_blocks,
                                                     config.block_length),
}


def build_strategy(config: DecodingConfig) -> Strategy:
    """The :class:`Strategy` object ``config`` describes."""
    return STRATEGIES[config.strategy](config)


@dataclass
class GenerationOutput:
    """Result of :func:`generate`."""

    sequences: torch.Tensor
    """``[B, P + G]``: (left-padded) prompt followed by the response."""
    prompt_length: int
    nfe: int
    """Model calls made for the whole batch."""
    sample_nfe: torch.Tensor
    """``[B]``: forwards charged to each sample (calls in which its current block had masks)."""
    early_stop: bool

    @property
    def responses(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_length :]


def propose(
    logits: torch.Tensor, mask_id: int, temperature: float, generator: torch.Generator | None, score: str,
    tempered: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Proposed tokens, their model probability (float64) and the strategy's score, per position.

    The mask token is never proposed; the probability is under the full softmax (mask included), as in the
    reference decoders, so decisions match them whenever the mask id is not the argmax. With ``tempered`` (and
    ``temperature > 0``) the confidence score is the probability under ``softmax(logits / temperature)`` instead.
    """
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    allowed = logits.float().index_fill(-1, torch.tensor([mask_id], device=logits.device), float("-inf"))
    if temperature > 0:
        uniform = torch.rand(allowed.shape, generator=generator, device=allowed.device, dtype=torch.float64)
        allowed = allowed.double() / temperature - torch.log(-torch.log(uniform.clamp_min(1e-300)))
    tokens = allowed.argmax(dim=-1)
    confidence = log_probs.gather(-1, tokens[..., None]).squeeze(-1).exp()
    if score == "entropy":
        return tokens, confidence, -(log_probs.exp() * log_probs).sum(dim=-1)
    if tempered and temperature > 0:
        tempered_log_probs = torch.log_softmax(logits.double() / temperature, dim=-1)
        return tokens, confidence, tempered_log_probs.gather(-1, tokens[..., None]).squeeze(-1).exp()
    return tokens, confidence, confidence


def early_stop_fill(response: torch.Tensor, stops: torch.Tensor, eos_id: int, finished: torch.Tensor) -> torch.Tensor:
    """Positions to set to EOS: after the first stop token of each row whose current block is ``finished``
    (has no masks left), not EOS yet. Rows still decoding their block are left alone, so their open masks
    keep the context they would have without early stop."""
    first = tokens_before_stop(response, stops)
    after = torch.arange(response.shape[1], device=response.device)[None] > first[:, None]
    return after & finished[:, None] & (response != eos_id)
