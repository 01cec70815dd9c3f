"""What the trainer and the decoder need to know about a masked-diffusion student.

A student is an ordinary transformers model plus a small :class:`StudentSpec`: its mask token, whether
its logits are shifted (Dream reads the prediction for token ``i`` at position ``i - 1``), and which
modules LoRA should wrap. The spec is stored on the model config (``config.trims_student``), so it
survives ``save_pretrained`` / PEFT wrapping and every component can recover it from the model alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .names import SAME_NAMES, ModuleNames


@dataclass(frozen=True)
class StudentSpec:
    """Static facts about one family of masked-diffusion students."""

    kind: str
    """Registry name: ``"llada"``, ``"llada_moe"``, ``"llada2"``, ``"dream"`` or ``"masked_lm"``."""
    shift_logits: bool
    """True when the logits at position ``i - 1`` predict token ``i`` (Dream)."""
    lora_target_modules: tuple[str, ...] | str
    """Module names (or a peft keyword such as ``"all-linear"``) that LoRA wraps; never the LM head."""
    decoder: bool
    """A transformers causal-LM class made bidirectional (takes position ids, a KV cache and ``logits_to_keep``);
    False for an ``AutoModelForMaskedLM``."""
    native_model_types: tuple[str, ...] = ()
    """``model_type`` values (lower case) of the family's original checkpoints, whose config :attr:`translate_config`
    converts (LLaDA-MoE's Hub config says ``llada`` like LLaDA-8B's; dLLM asks its users to rewrite it ``lladamoe``)."""
    native_key: str | None = None
    """A ``config.json`` key only this family's originals have, telling apart families that share a ``model_type``
    (LLaDA-8B's ``d_model``, LLaDA-MoE's ``num_experts``)."""
    translate_config: Callable[[dict[str, Any]], Any] | None = None
    """Original ``config.json`` dict -> the equivalent transformers config."""
    module_names: ModuleNames = SAME_NAMES
    """Original module paths <-> native ones where they differ (LLaDA's; none for Dream, whose names are Qwen2's)."""
    fuse_state_dict: Callable[[dict[str, Any], str], None] | None = None
    """(state dict, key prefix) -> None: original-layout tensors under the prefix merged, in place, into the native
    class's fused parameters (LLaDA-MoE's per-expert weights), where renaming alone does not reach them."""
    original_config: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None
    """(native config, the original ``config.json`` dict it was loaded from) -> the original dict to save: the
    inverse of :attr:`translate_config`, so a trained student is written as the original model is."""
    model_class: type | None = None
    """The transformers class the family loads into when ``AutoModelForCausalLM`` would pick another (LLaDA 2.x keeps
    its fused QKV projection in a GLM-4-MoE subclass); None: the auto class."""
    block_size: int | None = None
    """Block-diffusion students (LLaDA 2.x): attention is causal across blocks of this many positions and
    bidirectional inside one, in training (:mod:`trims_hf.students.block_diffusion`) and decoding; None: fully bidirectional."""

    def is_original(self, config_dict: dict[str, Any]) -> bool:
        """Whether ``config_dict`` is an original checkpoint's ``config.json`` of this family (translated at load)."""
        return (self.translate_config is not None
                and str(config_dict.get("model_type", "")).lower() in self.native_model_types
                and (self.native_key is None or self.native_key in config_dict))

    @property
    def key_mapping(self) -> dict[str, str] | None:
        """Checkpoint weight renames applied at every load (``from_pretrained(key_mapping=...)``)."""
        return self.module_names.key_mapping() or None

    def source_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Positions whose logits predict the tokens at ``positions`` (position 0 reads itself)."""
        if not self.shift_logits:
            return positions
        return (positions - 1).clamp(min=0)

    def align_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Return logits where ``[:, i]`` predicts token ``i`` for every student kind."""
        if not self.shift_logits:
            return logits
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def make_bidirectional(model: nn.Module) -> nn.Module:
    """Turn a transformers decoder into a full-attention (non-causal) model, in place.

    ``config.is_causal = False`` makes transformers build a bidirectional padding mask; setting every
    attention module's ``is_causal`` to False stops SDPA from falling back to a causal kernel when no
    mask is needed (no padding).
    """
    configs = {id(model.config): model.config}
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False
        config = getattr(module, "config", None)
        if config is not None:
            configs[id(config)] = config
    for config in configs.values():
        config.is_causal = False
    return model


GRAPHS_PER_BLOCK = 12
"""The compiled graphs one decoder block may need, in a process that decodes with every cache mode, when the cache
hands it no layer of its own (transformers' caches): attention asks the cache to update the layer it names by index, a
Python int ``torch.compile`` guards on, so each block compiles graphs of its own. Measured on the tiny students with
such a cache, no cache, prefix and dual in one process: LLaDA 6-7 a block, LLaDA-MoE 23 over its 3 blocks, LLaDA 2.x
(no dual cache) 21 over 3; 12 leaves room. trims_hf's decoding caches hand each block its layer
(:class:`_CompiledBlockCall`), and all blocks share a few graphs."""


class _CompiledBlockCall:
    """A compiled decoder block's call (``nn.Module._compiled_call_impl``) that hands the block its own layer of a cache
    that offers one (``cache.layer_view(layer_idx)``), before the compiled code sees the cache: nothing in the traced
    call then tells one block from another, so every block of a depth runs the same few graphs."""

    def __init__(self, compiled: Callable[..., Any], layer_idx: int) -> None:
        self.compiled = compiled
        self.layer_idx = layer_idx

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        layer_view = getattr(kwargs.get("cache"), "layer_view", None)  # transformers passes a block its cache by keyword
        if layer_view is not None:
            kwargs["cache"] = layer_view(self.layer_idx)
        return self.compiled(*args, **kwargs)


def _layer_index(block: nn.Module) -> int | None:
    """The layer index a decoder block's attention names its cache layer by (transformers' ``layer_idx``); None where
    its modules name none or several (a block that reads another layer's cache keeps the whole cache)."""
    indices = {module.layer_idx for module in block.modules() if isinstance(getattr(module, "layer_idx", None), int)}
    return indices.pop() if len(indices) == 1 else None


def compile_blocks(model: nn.Module, dynamic: bool | None = None) -> int:
    """Compile every decoder block of ``model`` (a student, PEFT-wrapped or not) in place with ``nn.Module.compile``;
    returns how many. In place, so the model keeps its modules, hooks, adapters and state dict: only the blocks' calls
    run compiled (parameters as graph inputs). The blocks are the classes transformers never splits across devices
    (``_no_split_modules``). A block compiled already is left as it is, so a decoder may ask for this at every call and
    compile once. ``dynamic`` goes to ``torch.compile``: None specialises on the first shapes and recompiles once with
    symbolic ones when they change.

    All blocks run one code object, whose compiled graphs dynamo caches together, 8 by default
    (``torch._dynamo.config.recompile_limit``): past that, dynamo stops compiling that code, and every block call that no
    graph already made fits runs eagerly. Each block is handed its own layer of trims_hf's decoding caches
    (:class:`_CompiledBlockCall`), so all blocks share a few graphs whatever the depth; a cache that cannot hand it over
    costs each block graphs of its own (:data:`GRAPHS_PER_BLOCK`), so the limits are raised to cover every block, never
    lowered."""
    import torch._dynamo  # the compiler, loaded only where something compiles

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    blocks = [module for module in model.modules() if type(module).__name__ in names]
    if not blocks:
        raise ValueError(f"compile_blocks: {type(base).__name__} names no decoder block (_no_split_modules={names or None}).")
    graphs = GRAPHS_PER_BLOCK * len(blocks)
    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, graphs)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, graphs)
    for block in blocks:
        if block._compiled_call_impl is None:
            block.compile(dynamic=dynamic)
            layer_idx = _layer_index(block)
            if layer_idx is not None:
                block._compiled_call_impl = _CompiledBlockCall(block._compiled_call_impl, layer_idx)
    return len(blocks)


def has_compiled_blocks(model: nn.Module) -> bool:
    """Whether any module of ``model`` runs compiled (:func:`compile_blocks`, or ``nn.Module.compile`` by the user): a
    compiled block stays so, whatever later calls ask, and its fused kernels may round differently."""
    return isinstance(model, nn.Module) and any(module._compiled_call_impl is not None for module in model.modules())

