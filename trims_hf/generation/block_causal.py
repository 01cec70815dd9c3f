"""Semi-autoregressive decoding of block-diffusion students (LLaDA 2.x) under their block-causal attention.

As the original ``LLaDA2MoeModelLM.generate`` and dLLM's ``LLaDA2Sampler`` do: blocks of ``block_length`` positions
are counted from each sample's first token, so the block holding the end of the prompt is the first one decoded (its
prompt tokens stay); the canvas runs to the end of the block holding the last generated position; a position attends
to its own block and the ones before, never to later blocks. Each step is one forward over the canvas up to the end of
the current blocks (later blocks are invisible anyway), and the strategy commits tokens of the current block
(``threshold_quota`` is the original's rule). Committed tokens never change. Left-padded prompts of different lengths
decode in one batch, each sample as it would alone: its blocks, positions and mask are its own, so its current block
can sit at other columns than its batch-mates'.

``cache="none"`` recomputes the canvas at every step, as the originals do. ``cache="prefix"`` runs the canvas once per
block and then only the columns from the first current block on, against the cached keys and values of the columns
before: exact here, not an approximation as for a bidirectional student, since under the block-causal mask those
columns (earlier blocks, all committed) never see a later one. There is no suffix to keep (``dual`` is refused).

``step`` runs the calls as it does for the other students (:mod:`trims_hf.generation.cache`) and never changes a
token: ``static`` writes a block's keys and values into buffers allocated at its first forward, at slots given as a
tensor; ``graph`` also captures each call shape of a block (its cached steps share one) as a CUDA graph at its second
call and replays it after. A block's buffers and graphs are its own, since the canvas a block sees grows with it:
the attention reads exactly the keys the eager step gives it, so the numbers cannot move.

Early stop (default on) is the original ``generate``'s: once a sample's current block has no masks and its response so
far holds a stop token, it decodes no further block and everything after its first stop becomes EOS.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import nn

from ..settings import DecodingConfig, StepMode
from ..students import mask_token_id
from ..students.block_diffusion import block_ids
from .cache import BlockKVCache, CapturedCalls
from .hooks import DecodeHook, StepRecord
from .steps import GenerationOutput, Strategy, early_stop_fill, propose, tokens_before_stop


def decode_block_causal(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                        config: DecodingConfig, step: StepMode, strategy: Strategy, stops: torch.Tensor,
                        eos_id: int | None, generator: torch.Generator | None,
                        hooks: Sequence[DecodeHook]) -> GenerationOutput:
    """:func:`trims_hf.generate` for a block-diffusion student (its setup, hooks' ``on_start`` / ``on_end`` and the
    step mode ``step``, resolved from ``config.step``, there)."""
    if config.cache not in ("none", "prefix"):
        raise ValueError(f"cache={config.cache!r}: a block-diffusion student sees no later block, so there is no suffix "
                         "to cache; use cache='prefix' (exact) or 'none'")
    layers = model.config.get_text_config().num_hidden_layers
    mask_id, size = mask_token_id(model), config.block_length
    batch, width = input_ids.shape
    device = input_ids.device
    real = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    lengths = real.sum(dim=1)
    first = width - lengths  # column of each sample's first prompt token
    first_block, end_block = lengths // size, -(-(lengths + config.gen_length) // size)
    total = width + int((end_block * size - lengths).max())
    x = torch.cat([input_ids, input_ids.new_full((batch, total - width), mask_id)], dim=1)
    columns = torch.arange(total, device=device)
    positions = (columns[None] - first[:, None]).clamp(min=0)
    blocks = block_ids(total, size, device)[positions]  # [B, total]: each sample's own blocks
    visible = (columns[None] >= first[:, None])[:, None, :] | torch.eye(total, dtype=torch.bool, device=device)
    allowed = ((blocks[:, None, :] <= blocks[:, :, None]) & visible)[:, None]  # [B, 1, total, total]
    response = x[:, width:width + config.gen_length]  # a view: writes go to x
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    nfe, sample_nfe = 0, torch.zeros(batch, dtype=torch.long, device=device)
    for block in range(int((end_block - first_block).max())):
        window = first[:, None] + (first_block[:, None] + block) * size + torch.arange(size, device=device)
        inside = (first_block + block < end_block)[:, None].expand(-1, size)
        window = window.clamp(max=total - 1)
        masked = (x.gather(1, window) == mask_id) & inside & ~done[:, None]
        initial, step_in_block = masked.sum(dim=1), 0
        end = int(window[masked.any(dim=1)].max()) + 1 if masked.any() else 0  # the block's canvas, kept to its end
        forward = BlockForward(model, layers, config.cache == "prefix", step)
        while masked.any():
            charged = masked.any(dim=1)
            current = int(window[charged, 0].min())  # the first column of any current block
            begin = 0 if forward.cache is None or step_in_block == 0 else current
            inputs = {"input_ids": x[:, begin:end], "attention_mask": allowed[:, :, begin:end, :end],
                      "position_ids": positions[:, begin:end], "slots": columns[begin:end]}
            logits = forward(inputs, begin, current, end)
            nfe, sample_nfe = nfe + 1, sample_nfe + charged
            at = (window - current).clamp(min=0, max=end - current - 1)
            window_logits = logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1]))
            tokens, confidence, scores = propose(window_logits, mask_id, config.temperature, generator,
                                                 strategy.score, strategy.tempered)
            commit = strategy.select(scores, masked, step_in_block, initial)
            x.scatter_(1, window, torch.where(commit, tokens, x.gather(1, window)))
            masked = (x.gather(1, window) == mask_id) & inside & ~done[:, None]
            finished = ~masked.any(dim=1)
            filled = torch.zeros_like(response, dtype=torch.bool)
            if config.early_stop:
                stopped = finished & (tokens_before_stop(response, stops) < response.shape[1])
                filled = early_stop_fill(response, stops, eos_id, finished)
                response.masked_fill_(filled, eos_id)
                done |= stopped
            if hooks:
                _record(hooks, nfe, block, charged, sample_nfe, commit, confidence, window, width, filled, response)
            step_in_block += 1
    return GenerationOutput(x[:, :width + config.gen_length], width, nfe, sample_nfe, config.early_stop)


class BlockForward:
    """The student's calls within one block. With ``cached`` (the prefix cache) the block's first call fills key/value
    buffers that its later calls extend; a ``graph`` step captures the block's call shapes, which write into those
    buffers, so buffers and graphs end with the block."""

    def __init__(self, model: nn.Module, layers: int, cached: bool, step: StepMode) -> None:
        self.model = model
        self.cache = BlockKVCache(layers, static=step != "eager") if cached else None
        self.graphs = CapturedCalls() if step == "graph" else None

    def __call__(self, inputs: dict[str, torch.Tensor], begin: int, current: int, end: int) -> torch.Tensor:
        """Logits ``[B, end - current, V]`` of the canvas window ``inputs`` (columns ``begin`` to ``end``): the head
        runs on the current blocks' columns only (a 157k vocabulary)."""
        if self.cache is not None:
            self.cache.window.start = begin
        run = partial(self._run, end - current)
        return run(inputs) if self.graphs is None else self.graphs((begin, current, end), inputs, run)

    def _run(self, keep: int, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        cached = {}
        if self.cache is not None:
            self.cache.window.slots = inputs["slots"]
            cached = {"use_cache": True, "cache": self.cache}
        return self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                          position_ids=inputs["position_ids"], logits_to_keep=keep, **cached).logits


def _record(hooks: Sequence[DecodeHook], nfe: int, block: int, charged: torch.Tensor, sample_nfe: torch.Tensor,
            commit: torch.Tensor, confidence: torch.Tensor, window: torch.Tensor, width: int, filled: torch.Tensor,
            response: torch.Tensor) -> None:
    """One :class:`StepRecord` over the response positions (a window's prompt and beyond-the-response columns are not
    response positions)."""
    length = response.shape[1]
    at = window - width
    kept = commit & (at >= 0) & (at < length)
    rows = torch.arange(len(at), device=at.device)[:, None].expand_as(at)
    committed = torch.zeros_like(response, dtype=torch.bool)
    committed[rows[kept], at[kept]] = True
    confidences = torch.full(response.shape, float("nan"), dtype=torch.float64, device=response.device)
    confidences[rows[kept], at[kept]] = confidence[kept]
    record = StepRecord(nfe - 1, block, charged, sample_nfe.clone(), committed, confidences, filled, response.clone())
    for hook in hooks:
        hook.on_step(record)
