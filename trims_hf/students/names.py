"""Module names of an original checkpoint (LLaDA's remote code) versus the native transformers class, both ways.

One table of module paths is the single source of every rename: checkpoint weights at load
(``from_pretrained(key_mapping=...)``), weights written back in the original layout, adapter tensors and LoRA
target modules in either direction. Paths are matched as whole dotted components, so ``model.norm`` never matches
inside ``attn_norm`` and LLaDA's LM head ``model.transformer.ff_out`` never matches a block's ``ff_out``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LAYER = "{i}"
"""Placeholder for the layer index in a module path template."""


def _pattern(template: str) -> str:
    """Regex matching ``template`` as whole dotted components of a longer name (layer index captured)."""
    return r"(?<![^.])" + re.escape(template).replace(re.escape(LAYER), r"(\d+)") + r"(?=\.|$)"


def _replacement(template: str) -> str:
    return template.replace(LAYER, r"\1")


@dataclass(frozen=True)
class ModuleNames:
    """Pairs ``(original module path, native module path)``, relative to the model root; ``{i}`` is a layer index."""

    pairs: tuple[tuple[str, str], ...]

    def key_mapping(self) -> dict[str, str]:
        """Original -> native regexes in the form ``from_pretrained(key_mapping=...)`` applies to checkpoint keys."""
        return {_pattern(original): _replacement(native) for original, native in self.pairs}

    def _rename(self, name: str, to_native: bool) -> str:
        for original, native in self.pairs:
            source, target = (original, native) if to_native else (native, original)
            renamed, count = re.subn(_pattern(source), _replacement(target), name, count=1)
            if count:
                return renamed
        return name

    def to_native(self, name: str) -> str:
        """The native name of an original parameter / module name (any prefix or suffix kept); others unchanged."""
        return self._rename(name, to_native=True)

    def to_original(self, name: str) -> str:
        """The original name of a native parameter / module name (any prefix or suffix kept); others unchanged."""
        return self._rename(name, to_native=False)

    def is_original(self, name: str) -> bool:
        """True when ``name`` contains an original module path (it would be renamed on the way in)."""
        return self.to_native(name) != name


SAME_NAMES = ModuleNames(())
"""The table of a family whose original module names already are the native class's (Dream's are Qwen2's)."""
