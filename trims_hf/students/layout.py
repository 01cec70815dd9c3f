"""Trained LLaDA / Dream students written as the original model is, so the field's tools load them.

Fast-dLLM, dLLM, d3LLM and SGLang load LLaDA and Dream through their original Hub code: LLaDA's module names,
a ``llada`` / ``Dream`` config with ``auto_map``, the code and tokenizer files beside the weights. A student
that :func:`trims_hf.load_student` read from such a checkpoint therefore saves in that layout by default
(``model.save_pretrained(folder)``, also from a Trainer, after ``merge_and_unload``); ``layout="native"`` writes
transformers' Llama / Qwen2 layout instead. :func:`trims_hf.load_student` reads both.
"""

from __future__ import annotations

import json
import logging
import shutil
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from .registry import student_spec

logger = logging.getLogger(__name__)

LAYOUTS = ("original", "native")
"""``original``: the base checkpoint's own names, config and files; ``native``: transformers' class layout."""

COPIED_FILES = ("*.py", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja", "generation_config.json")
"""Files of the base checkpoint copied next to a saved student: the original modeling code that ``auto_map``
names, and the tokenizer, so the folder is complete for the original code."""


@dataclass(frozen=True)
class OriginalLayout:
    """Where a student came from, enough to write it back the same way."""

    config: dict[str, Any]
    """The base's original ``config.json`` dict (``auto_map`` and every field the native port does not use)."""
    source: str
    """The base's folder or Hub id, whose :data:`COPIED_FILES` are copied along."""
    revision: str | None = None
    token: str | bool | None = None


def use_original_layout(model: nn.Module, layout: OriginalLayout) -> None:
    """Make ``model.save_pretrained`` write ``layout`` by default (in place; survives ``merge_and_unload``), and
    ``model.load_state_dict`` read it back: the Trainer resumes a full fine-tune (and loads its best model) with
    ``load_state_dict(strict=False)``, which would otherwise skip every original-layout key with a mere warning."""
    model._trims_original_layout = layout
    model.save_pretrained = types.MethodType(save_student, model)
    model.register_load_state_dict_pre_hook(_native_names)


def _native_names(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """A ``load_state_dict`` pre-hook: keys in the original layout renamed (and fused) in place to the native ones."""
    spec = student_spec(module)
    rename = spec.module_names.to_native
    for key in [key for key in state_dict if key.startswith(prefix)]:
        native = prefix + rename(key[len(prefix):])
        if native != key:
            state_dict[native] = state_dict.pop(key)
    if spec.fuse_state_dict is not None:
        spec.fuse_state_dict(state_dict, prefix)


def original_layout(model: nn.Module) -> OriginalLayout | None:
    """The original layout ``model`` was loaded from, or None (a native checkpoint, or a model built in code)."""
    return getattr(model, "_trims_original_layout", None)


def save_student(model: nn.Module, save_directory: str | Path, *, layout: str = "original", **kwargs: Any) -> None:
    """``save_pretrained`` of a student read from an original checkpoint: ``layout="original"`` (default) writes the
    original names, config and files; ``"native"`` the transformers class's layout. Other keyword arguments are
    ``PreTrainedModel.save_pretrained``'s (``state_dict``, ``is_main_process``, ``max_shard_size``...)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: choose one of {', '.join(LAYOUTS)}")
    base = type(model).save_pretrained
    source = original_layout(model)
    if layout == "native" or source is None:
        base(model, save_directory, save_original_format=False, **kwargs)
        return
    if kwargs.get("push_to_hub"):
        raise ValueError("save_pretrained(push_to_hub=True) would upload before the original config is written: "
                         "save to a folder, then push it (trims export --push-to-hub does both)")
    base(model, save_directory, save_original_format=True, **kwargs)
    if not kwargs.get("is_main_process", True):
        return
    folder = Path(save_directory)
    _copy_base_files(source, folder)
    config = student_spec(model).original_config(model.config, source.config)
    if "torch_dtype" in config:
        config["torch_dtype"] = str(model.dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _copy_base_files(source: OriginalLayout, folder: Path) -> None:
    """Copy the base's code and tokenizer files into ``folder`` (from the folder, or the Hub when it answers)."""
    base = Path(source.source).expanduser()
    if not base.is_dir():
        from huggingface_hub import snapshot_download

        try:
            base = Path(snapshot_download(source.source, revision=source.revision, token=source.token,
                                          allow_patterns=list(COPIED_FILES)))
        except Exception as error:  # noqa: BLE001 - the weights and config are written; only the extras are missing
            logger.warning("could not copy the code and tokenizer files of %s (%s); add them to %s to load it with the "
                           "original code", source.source, error, folder)
            return
    for pattern in COPIED_FILES:
        for path in base.glob(pattern):
            shutil.copyfile(path, folder / path.name)
