"""Student forwards for block decoding, with Fast-dLLM's approximate key/value reuse.

A masked-diffusion decoder only changes tokens inside the current block, so keys/values of the other
positions move little between steps. Fast-dLLM exploits this:

* ``"prefix"``: one full forward at each block start; later steps recompute the block and everything
  after it (the masked suffix) against the prefix keys/values cached at the block start.
* ``"dual"``: prefix and suffix keys/values are both kept from the block start; later steps recompute
  only the block. Everything is refreshed by the full forward at the next block start.

Both are served by one :class:`BlockKVCache`: a full-length key/value buffer per layer into which each
call writes the slots of the window it recomputes, attending to the whole buffer. Every model call is one
forward (NFE), cached or not. Reuse is an approximation (stale keys/values), measured in the tests.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, get_args

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin

from ..settings import CacheMode
from ..students import StudentSpec


@dataclass
class _Window:
    """Absolute index of the first position the current call recomputes (shared by all layers)."""

    start: int = 0


class _FullLengthLayer(CacheLayerMixin):
    """One layer's keys/values for the whole sequence; a call overwrites its window's slots."""

    is_sliding = False

    def __init__(self, window: _Window) -> None:
        super().__init__()
        self.window = window

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.keys, self.values = key_states, value_states
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if self.window.start == 0 and (not self.is_initialized or key_states.shape[-2] == self.keys.shape[-2]):
            self.lazy_initialization(key_states, value_states)  # full forward: the fresh tensors are the cache
        else:
            stop = self.window.start + key_states.shape[-2]
            self.keys[:, :, self.window.start : stop] = key_states
            self.values[:, :, self.window.start : stop] = value_states
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.keys.shape[-2] if self.is_initialized else query_length), 0

    def get_seq_length(self) -> int:
        return self.window.start

    def get_max_length(self) -> int:
        return self.keys.shape[-2] if self.is_initialized else -1


class BlockKVCache(Cache):
    """Full-length key/value buffers whose window slots are rewritten by each decoding call."""

    def __init__(self, num_layers: int) -> None:
        self.window = _Window()
        super().__init__(layers=[_FullLengthLayer(self.window) for _ in range(num_layers)])


def _check_left_padding_supported(model: nn.Module) -> None:
    """A left-padded masked LM decodes like its unpadded self only if it takes position ids counted from 0 at
    the first real token (BERT, DistilBERT; ModernBERT's rotary positions ignore the shift anyway). Models
    whose position embeddings reserve a padding row (RoBERTa family) offset their positions: reject."""
    parameters = inspect.signature(model.forward).parameters.values()
    if not any(p.name == "position_ids" or p.kind is p.VAR_KEYWORD for p in parameters):
        raise ValueError(f"{type(model).__name__} takes no position_ids, so left padding would shift its "
                         "positions; decode masked-LM prompts one at a time (batch size 1) or without padding.")
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, nn.Embedding) and module.padding_idx is not None:
            raise ValueError(f"{type(model).__name__} offsets its positions by a padding index, so left-padded "
                             "prompts would decode differently; decode masked-LM prompts one at a time (batch size 1).")


class StudentForward:
    """Runs the student for one decoding step and returns aligned logits of the current block.

    ``refresh=True`` (block start, or always without a cache) is a full forward; otherwise only the
    cache mode's window is recomputed. Logits are projected only at the positions that predict the
    block (``logits_to_keep``), which matters for 126k-152k vocabularies.
    """

    def __init__(
        self,
        model: nn.Module,
        spec: StudentSpec,
        mode: CacheMode,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
    ) -> None:
        if mode not in get_args(CacheMode):
            raise ValueError(f"cache={mode!r}; choose one of {get_args(CacheMode)}.")
        if mode != "none" and not spec.decoder:
            raise ValueError("KV caching needs a decoder student (llada/dream); use cache='none' for masked LMs.")
        self.model, self.spec, self.mode = model, spec, mode
        self.attention_mask, self.position_ids = attention_mask, position_ids
        self.cache = BlockKVCache(model.config.get_text_config().num_hidden_layers) if mode != "none" else None
        self.masked_lm_kwargs: dict[str, Any] = {}
        if not spec.decoder and attention_mask is not None and not bool(attention_mask.all()):
            _check_left_padding_supported(model)
            self.masked_lm_kwargs = {"position_ids": position_ids}

    @property
    def commits_block_head_at_refresh(self) -> bool:
        """Shifted students lose the predictor of a block's first token in cached steps (it sits before the
        window), so, as in Fast-dLLM, the decoder commits that token at the block's full forward."""
        return self.spec.shift_logits and self.mode != "none"

    def __call__(self, x: torch.Tensor, start: int, end: int, refresh: bool) -> torch.Tensor:
        """Logits ``[B, end - start, V]`` whose row ``j`` predicts position ``start + j``."""
        window_start = 0 if refresh or self.cache is None else start
        window_end = end if self.mode == "dual" and not refresh else x.shape[1]
        sources = self.spec.source_positions(torch.arange(start, end, device=x.device))
        # A shifted student's block head has no source inside a cached window; it reads itself (never used,
        # the decoder committed that position at the refresh).
        sources = (sources - window_start).clamp(min=0)
        if not self.spec.decoder:
            return self.model(input_ids=x, attention_mask=self.attention_mask, **self.masked_lm_kwargs).logits[:, sources]
        kwargs: dict[str, Any] = {"use_cache": False}
        if self.cache is not None:
            self.cache.window.start = window_start
            kwargs = {"use_cache": True, "cache": self.cache}
        return self.model(
            input_ids=x[:, window_start:window_end],
            attention_mask=self.attention_mask,
            position_ids=self.position_ids[:, window_start:window_end],
            logits_to_keep=sources,
            **kwargs,
        ).logits
