"""Parallel block decoding for masked-diffusion students (LLaDA fixed steps, Fast-dLLM rules).

The response starts as masks after the prompt and is decoded block by block, left to right. Each step is
one model call: every masked position of the current block gets a proposal (argmax, or a tempered sample)
and a score (the model probability of the proposal, in float64, or the entropy of its distribution); a
:class:`Strategy` picks which candidates to commit, and the decoder always commits at least the best one
so every step makes progress. Committed tokens are never remasked.

Early stop (default on) never changes a token up to the first stop: with bidirectional attention the masks
of the block still being decoded see every later position, so nothing is touched while a sample's block
has masks. Once the block holding a sample's first stop token is fully decoded, every position after that
stop becomes EOS; later blocks made only of EOS cost no forward (a batch skips a block only when all its
samples are done). Everything up to the stop is then committed, and committed tokens never change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ..prompts import Prompt, end_of_response_ids, prompt_token_ids
from ..settings import DecodingConfig, PromptFormat, ResponseFormat
from ..students import mask_token_id, student_spec
from .cache import StudentForward
from .hooks import (
    DecodeHook,
    GenerationStart,
    StepRecord,
    answer_text,
    tokens_before_stop,
)


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


def _propose(
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


def _eos_ids(model: nn.Module) -> list[int]:
    eos = getattr(model.config.get_text_config(), "eos_token_id", None)
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def _early_stop_fill(response: torch.Tensor, stops: torch.Tensor, eos_id: int, finished: torch.Tensor) -> torch.Tensor:
    """Positions to set to EOS: after the first stop token of each row whose current block is ``finished``
    (has no masks left), not EOS yet. Rows still decoding their block are left alone, so their open masks
    keep the context they would have without early stop."""
    first = tokens_before_stop(response, stops)
    after = torch.arange(response.shape[1], device=response.device)[None] > first[:, None]
    return after & finished[:, None] & (response != eos_id)


def _check_left_padded(attention_mask: torch.Tensor | None) -> None:
    """Refuse a right-padded (or holed) prompt batch: the decoders count positions and append the response after the
    last column, so a 0 after a 1 would put padding inside the context."""
    if attention_mask is None:
        return
    real = attention_mask.bool()
    holes = (real.long().cummax(dim=1).values.bool() & ~real).any(dim=1)
    if bool(holes.any()):
        row = int(holes.nonzero()[0, 0])
        raise ValueError(f"prompts must be left-padded: row {row} of attention_mask has a 0 after a 1 "
                         "(tokenize with padding_side='left')")


@torch.no_grad()
def generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: DecodingConfig | None = None,
    hooks: Sequence[DecodeHook] = (),
    sample_ids: Sequence[Hashable] | None = None,
) -> GenerationOutput:
    """Decode ``config.gen_length`` tokens after each (LEFT-padded) prompt with a prepared student.

    ``attention_mask`` marks real prompt tokens (1) and left padding (0); positions are counted from each
    sample's first real token, so a padded sample decodes exactly as it would alone. ``sample_ids`` name
    the rows for the hooks (default: consecutive integers per recorder). A block-diffusion student (LLaDA 2.x)
    decodes with its block-causal attention instead (:mod:`trims_hf.generation.block_causal`).
    """
    config = config or DecodingConfig()
    _check_left_padded(attention_mask)
    spec, mask_id = student_spec(model), mask_token_id(model)
    strategy = build_strategy(config)
    batch, prompt_length = input_ids.shape
    device = input_ids.device
    eos_ids = _eos_ids(model)
    eos_id = config.eos_token_id if config.eos_token_id is not None else (eos_ids[0] if eos_ids else None)
    stop_ids = tuple(config.stop_token_ids if config.stop_token_ids is not None else eos_ids)
    if config.early_stop and (eos_id is None or not stop_ids):
        raise ValueError("early_stop needs an EOS id and stop ids; set DecodingConfig.eos_token_id / stop_token_ids.")
    stops = torch.tensor(stop_ids, dtype=input_ids.dtype, device=device)
    generator = torch.Generator(device=device).manual_seed(config.seed) if config.seed is not None else None

    start = GenerationStart(
        batch, prompt_length, config, stop_ids, eos_id, tuple(sample_ids) if sample_ids is not None else None
    )
    for hook in hooks:
        hook.on_start(start)
    if spec.block_size is not None:
        from .block_causal import decode_block_causal  # it builds on this module's proposals

        output = decode_block_causal(model, input_ids, attention_mask, config, strategy, stops, eos_id, generator, hooks)
        for hook in hooks:
            hook.on_end(output)
        return output

    x = torch.cat([input_ids, input_ids.new_full((batch, config.gen_length), mask_id)], dim=1)
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch, config.gen_length)], dim=1)
        position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    else:
        position_ids = torch.arange(x.shape[1], device=device).expand(batch, -1)
    forward = StudentForward(model, spec, config.cache, attention_mask, position_ids, config.step)
    nfe, sample_nfe = 0, torch.zeros(batch, dtype=torch.long, device=device)
    response = x[:, prompt_length:]  # a view: writes go to x
    for block in range(config.num_blocks):
        begin = block * config.block_length
        end = begin + config.block_length
        masked = response[:, begin:end] == mask_id
        initial = masked.sum(dim=1)
        step_in_block = 0
        while masked.any():
            logits = forward(x, prompt_length + begin, prompt_length + end, refresh=step_in_block == 0)
            charged = masked.any(dim=1)
            nfe, sample_nfe = nfe + 1, sample_nfe + charged
            tokens, confidence, scores = _propose(logits, mask_id, config.temperature, generator, strategy.score,
                                                  strategy.tempered)
            commit = strategy.select(scores, masked, step_in_block, initial)
            if step_in_block == 0 and forward.commits_block_head_at_refresh:
                commit[:, 0] |= masked[:, 0]
            response[:, begin:end] = torch.where(commit, tokens, response[:, begin:end])
            masked = response[:, begin:end] == mask_id
            filled = torch.zeros_like(response, dtype=torch.bool)
            if config.early_stop:
                filled = _early_stop_fill(response, stops, eos_id, finished=~masked.any(dim=1))
                response.masked_fill_(filled, eos_id)
            if hooks:
                committed = torch.zeros_like(response, dtype=torch.bool)
                committed[:, begin:end] = commit
                confidences = torch.full(response.shape, float("nan"), dtype=torch.float64, device=device)
                confidences[:, begin:end] = torch.where(commit, confidence, confidences[:, begin:end])
                record = StepRecord(
                    nfe - 1, block, charged, sample_nfe.clone(), committed, confidences, filled, response.clone()
                )
                for hook in hooks:
                    hook.on_step(record)
            step_in_block += 1
    output = GenerationOutput(x, prompt_length, nfe, sample_nfe, config.early_stop)
    for hook in hooks:
        hook.on_end(output)
    return output


def generate_text(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    config: DecodingConfig | None = None,
    hooks: Sequence[DecodeHook] = (),
    sample_ids: Sequence[Hashable] | None = None,
    prompt_format: PromptFormat | None = None,
    stop_strings: Sequence[str] = (),
) -> list[str]:
    """Render (:func:`trims_hf.prompts.prompt_token_ids`, as in training), left-pad and decode ``prompts``; returns
    the answers (:func:`~trims_hf.generation.hooks.answer_text`): cut before their first stop token, then before the
    earliest of ``stop_strings``. Stop ids default to the model's and the tokenizer's EOS ids plus the ids that end
    a response in training (:func:`trims_hf.prompts.end_of_response_ids` of a :class:`ResponseFormat`'s
    ``end_of_response``; by default the chat template's end of turn, e.g. LLaDA's ``<|eot_id|>``)."""
    config = config or DecodingConfig()
    fmt = prompt_format or ResponseFormat()
    encoded = [prompt_token_ids(tokenizer, prompt, fmt) for prompt in prompts]
    batch = tokenizer.pad({"input_ids": encoded}, padding=True, padding_side="left", return_tensors="pt")
    eos_ids = dict.fromkeys(_eos_ids(model) + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
                            + end_of_response_ids(tokenizer, getattr(fmt, "end_of_response", None)))
    config = replace(
        config,
        stop_token_ids=config.stop_token_ids if config.stop_token_ids is not None else tuple(eos_ids),
        eos_token_id=config.eos_token_id if config.eos_token_id is not None else next(iter(eos_ids), None),
    )
    device = next(model.parameters()).device
    output = generate(
        model, batch["input_ids"].to(device), batch["attention_mask"].to(device), config, hooks, sample_ids
    )
    lengths = tokens_before_stop(output.responses, config.stop_token_ids).tolist()
    return [answer_text(tokenizer, row[:length], stop_strings)[0]
            for row, length in zip(output.responses.tolist(), lengths)]
