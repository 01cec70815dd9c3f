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

How a call runs (``DecodingConfig.step``) never changes a token:

* ``"eager"``: transformers builds the attention mask from the 2-D padding mask at every call (a host sync
  to see whether it can be dropped) and the cache adopts the fresh tensors at each full forward.
* ``"static"``: the buffers are allocated once per generation and every call writes into them in place, at
  slots given as a tensor; the mask is decided once per generation: none when no row is padded (so SDPA
  may take its flash kernels), else one additive ``[B, 1, 1, L]`` mask that every call shares. One call then
  has fixed shapes for a given (batch, sequence length, window length).
* ``"graph"``: static, and each shape is captured once as a CUDA graph and replayed: at batch 1 the
  host's ~1,000 kernel launches per forward, not the GPU, set the pace of an 8B student. A forward that reads
  tensor values on the host cannot be captured: an MoE student's experts outside bfloat16 on compute capability
  9.x / 10.x do (:func:`uncapturable_experts`), so ``"auto"`` runs such a student static and ``"graph"`` refuses it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin

from ..settings import CacheMode, StepMode
from ..students import StudentSpec


@dataclass
class _Window:
    """The positions the current call recomputes (shared by all layers): the first one, and (static step) all of
    them as a tensor, which a captured graph reads from a buffer refilled before each replay."""

    start: int = 0
    slots: torch.Tensor | None = None


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


class _StaticLayer(_FullLengthLayer):
    """Buffers allocated at the first (full) forward in the fresh keys' and values' memory layout, so attention
    reads the strides the eager path gives it and computes the same numbers; every later call copies into them:
    a full forward whole, a window at ``window.slots``."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(torch.empty_like(key_states), torch.empty_like(value_states))
        if key_states.shape[-2] == self.keys.shape[-2]:
            self.keys.copy_(key_states)
            self.values.copy_(value_states)
        else:
            self.keys.index_copy_(2, self.window.slots, key_states)
            self.values.index_copy_(2, self.window.slots, value_states)
        return self.keys, self.values


class _OneLayer:
    """One layer of a :class:`BlockKVCache`, handed to a compiled decoder block in place of the whole cache
    (:func:`~trims_hf.students.compile_blocks`). Attention asks the cache to update the layer it names by index; a
    compiled block would specialise on that Python int and compile graphs of its own for every block. This handle
    ignores the index, so every block traces the same code on the same kinds of objects and all share their graphs."""

    def __init__(self, layer: _FullLengthLayer) -> None:
        self.layer = layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        return self.layer.update(key_states, value_states)


class BlockKVCache(Cache):
    """Full-length key/value buffers whose window slots are rewritten by each decoding call; ``static`` buffers are
    allocated once and written in place (:class:`_StaticLayer`)."""

    def __init__(self, num_layers: int, static: bool = False) -> None:
        self.window = _Window()
        layer = _StaticLayer if static else _FullLengthLayer
        super().__init__(layers=[layer(self.window) for _ in range(num_layers)])

    def layer_view(self, layer_idx: int) -> _OneLayer:
        """The cache as the block at ``layer_idx`` alone needs it (see :class:`_OneLayer`)."""
        return _OneLayer(self.layers[layer_idx])


GROUPED_GEMM_CAPTURABLE = (torch.bfloat16, (9, 10))
"""The experts' dtype and the compute capability majors (H100/H200, B200) for which torch's grouped GEMM runs one
kernel that reads the experts' token offsets on the GPU (torch 2.11's ``_grouped_mm_cuda`` fast path). Any other dtype
or device takes its fallback: a loop over the experts that first copies the offsets to the host (``offs.cpu()``), and
sizes each expert's matmul by them, which no CUDA graph can capture."""


def uncapturable_experts(model: nn.Module, device: torch.device) -> str | None:
    """Why a CUDA graph cannot capture the experts of ``model`` on ``device`` (a clause in the user's terms), or None
    when it can or the model has none. transformers runs fused experts (a 3-D ``down_proj``) as their config's
    ``_experts_implementation`` says: ``grouped_mm`` (its default) through torch's grouped GEMM, capturable only as
    :data:`GROUPED_GEMM_CAPTURABLE` says; ``eager`` as a loop over the experts the router chose, found on the host
    (``nonzero``). Other implementations (``batched_mm``: fixed shapes) are left to the capture, and so are experts
    this does not recognise (a ``ModuleList`` of per-expert layers, as some remote-code MoE models hold): the students
    trims_hf loads all use transformers' fused experts."""
    missing = object()
    for module in model.modules():
        weight = getattr(module, "down_proj", None)
        implementation = getattr(getattr(module, "config", None), "_experts_implementation", missing)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 3 or implementation is missing:
            continue
        if implementation in (None, "eager"):
            return ("its experts run transformers' eager loop (experts_implementation='eager'), which reads the routed "
                    "experts on the host")
        if implementation != "grouped_mm":
            continue
        dtype, majors = GROUPED_GEMM_CAPTURABLE
        if weight.dtype != dtype:
            return (f"its {str(weight.dtype).removeprefix('torch.')} experts run torch's grouped GEMM as a loop that "
                    "reads each expert's token count on the host (its one-kernel path takes bfloat16 only)")
        major, minor = torch.cuda.get_device_capability(device)
        if major not in majors:
            return (f"on a compute capability {major}.{minor} GPU torch's grouped GEMM runs its experts as a loop that "
                    "reads each expert's token count on the host (its one-kernel path needs 9.x or 10.x)")
    return None


def resolve_step(step: StepMode, device: torch.device, spec: StudentSpec, model: nn.Module) -> StepMode:
    """The step mode ``step`` means for ``model``, a student of ``spec``, on ``device``: ``auto`` is graph on CUDA and
    static elsewhere for decoder students, eager for masked LMs (their forwards take no cache or position ids); on
    CUDA, static for a student whose experts no graph can capture (:func:`uncapturable_experts`), which ``graph``
    refuses in one line before any forward."""
    if step == "auto":
        if not spec.decoder:
            return "eager"
        return "graph" if device.type == "cuda" and uncapturable_experts(model, device) is None else "static"
    if step != "eager" and not spec.decoder:
        raise ValueError(f"step={step!r} needs a decoder student (llada/dream); masked LMs decode with step='eager'.")
    if step == "graph" and device.type != "cuda":
        raise ValueError(f"step='graph' captures CUDA graphs, but the model is on {device.type}; use step='static'.")
    if step == "graph" and (reason := uncapturable_experts(model, device)) is not None:
        raise ValueError(f"step='graph' cannot capture this student as a CUDA graph: {reason}; use step='static' (the "
                         "same tokens, and what step='auto' runs here).")
    return step


def additive_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, 1, 1, L]`` in ``dtype``: 0 where a key may be attended, the dtype's minimum where it is padding. SDPA
    broadcasts it over heads and queries, for every window. Additive rather than boolean: SDPA ran 14% faster with it
    at the padded batch's shape on an H100 (``bench/real_size.py``'s mask-form line)."""
    keep = attention_mask.bool()[:, None, None, :]
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)


@dataclass
class _Captured:
    buffers: dict[str, torch.Tensor]
    graph: Any = None
    output: torch.Tensor | None = None


class CapturedCalls:
    """One CUDA graph per call shape, all in one memory pool. A shape's first call runs eagerly on copies of its
    inputs, which become the graph's input buffers, and allocates what later calls reuse (key/value buffers,
    cuBLAS workspaces, attention plans); its second call warms up on a side stream, as ``torch.cuda.graph``
    asks, captures and replays; later calls refill the buffers and replay. A call must therefore do the same
    thing whenever it is repeated with the same inputs (the decoder's forwards write the same slots with the
    same values), and its output is valid until the next call of the same shape."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        self.captured: dict[Any, _Captured] = {}

    def __call__(self, key: Any, inputs: dict[str, torch.Tensor],
                 run: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> torch.Tensor:
        entry = self.captured.get(key)
        if entry is None:
            entry = self.captured[key] = _Captured({name: value.clone() for name, value in inputs.items()})
            return run(entry.buffers)
        for name, value in inputs.items():
            entry.buffers[name].copy_(value)
        if entry.graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run(entry.buffers)
            torch.cuda.current_stream().wait_stream(side)
            entry.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(entry.graph, pool=self.pool):
                entry.output = run(entry.buffers)
        entry.graph.replay()
        return entry.output


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
    block (``logits_to_keep``), which matters for 126k-152k vocabularies. ``step`` says how the model
    call runs (module docstring; :func:`resolve_step`).
    """

    def __init__(
        self,
        model: nn.Module,
        spec: StudentSpec,
        mode: CacheMode,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        step: StepMode = "eager",
    ) -> None:
        if mode not in get_args(CacheMode):
            raise ValueError(f"cache={mode!r}; choose one of {get_args(CacheMode)}.")
        if mode != "none" and not spec.decoder:
            raise ValueError("KV caching needs a decoder student (llada/dream); use cache='none' for masked LMs.")
        self.model, self.spec, self.mode = model, spec, mode
        self.attention_mask, self.position_ids = attention_mask, position_ids
        self.step = resolve_step(step, position_ids.device, spec, model)
        self.cache = None if mode == "none" else BlockKVCache(model.config.get_text_config().num_hidden_layers,
                                                              static=self.step != "eager")
        if self.step != "eager":
            padded = attention_mask is not None and not bool(attention_mask.all())
            # In the dtype attention computes in (a transformers model's; a plain module's default float otherwise).
            dtype = getattr(model, "dtype", torch.get_default_dtype())
            self.static_mask = additive_mask(attention_mask, dtype) if padded else None
            self.slots = torch.arange(position_ids.shape[1], device=position_ids.device)
        self.graphs = CapturedCalls() if self.step == "graph" else None
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
        if self.step != "eager":
            inputs = {"input_ids": x[:, window_start:window_end], "slots": self.slots[window_start:window_end],
                      "position_ids": self.position_ids[:, window_start:window_end], "logits_to_keep": sources}

            def run(buffers: dict[str, torch.Tensor]) -> torch.Tensor:
                if self.cache is not None:
                    self.cache.window.slots = buffers["slots"]
                return self.model(input_ids=buffers["input_ids"], attention_mask=self.static_mask,
                                  position_ids=buffers["position_ids"], logits_to_keep=buffers["logits_to_keep"],
                                  **kwargs).logits

            return run(inputs) if self.graphs is None else self.graphs(window_end - window_start, inputs, run)
        return self.model(
            input_ids=x[:, window_start:window_end],
            attention_mask=self.attention_mask,
            position_ids=self.position_ids[:, window_start:window_end],
            logits_to_keep=sources,
            **kwargs,
        ).logits
