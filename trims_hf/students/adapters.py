"""LoRA adapters in either naming onto a student, every tensor loaded or one error naming what did not fit.

Adapters trained with the field's tools (dLLM, the original remote code) name LLaDA's modules as the original code
does (``model.transformer.blocks.N.q_proj``...); ours name the native Llama modules. ``peft`` given the wrong naming
wraps some modules, loads nothing and only warns, and an adapter of another base decodes as a different model.
:func:`load_adapter` renames original names to native ones through the one table of
:mod:`trims_hf.students.names`, checks the recorded base and every shape before the model is touched, and refuses
any tensor that does not land in the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .registry import student_spec

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""Prefix of every tensor name in a saved peft adapter (the model root follows it)."""
LORA_MARK = ".lora_"
"""Start of the LoRA parameter part of a tensor name (``.lora_A.weight``, ``.lora_B.weight``...)."""


class AdapterError(ValueError):
    """An adapter that would not load exactly onto the student (other base, other shapes, unknown modules)."""


def adapter_folder(adapter: str, revision: str | None = None, token: str | bool | None = None) -> Path:
    """The local folder of ``adapter`` (a folder, or a Hub id downloaded)."""
    folder = Path(adapter).expanduser()
    if folder.is_dir():
        if not (folder / ADAPTER_CONFIG).is_file():
            raise AdapterError(f"adapter {adapter}: the folder has no {ADAPTER_CONFIG}")
        return folder
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(adapter, revision=revision, token=token,
                                      allow_patterns=[ADAPTER_CONFIG, ADAPTER_WEIGHTS]))
    except Exception as error:  # noqa: BLE001 - a bad id, no network, no such repo: one line, the cause named
        raise AdapterError(f"adapter {adapter}: no such folder, and not loadable from the Hub "
                           f"({type(error).__name__})") from None


def read_adapter(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The ``adapter_config.json`` dict and the tensors of an adapter folder."""
    from safetensors.torch import load_file

    weights = folder / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise AdapterError(f"adapter {folder}: no {ADAPTER_WEIGHTS}")
    return json.loads((folder / ADAPTER_CONFIG).read_text()), load_file(weights)


def _base_name(name_or_path: str) -> str:
    return Path(str(name_or_path).rstrip("/")).name.lower()


def check_adapter_base(adapter_config: dict[str, Any], base: str, adapter: str, allow_base_mismatch: bool) -> None:
    """Refuse an adapter recorded as trained on another base (compared by repository / folder name, so a Hub id and
    its local copy match); ``allow_base_mismatch`` accepts a renamed base on purpose."""
    recorded = adapter_config.get("base_model_name_or_path")
    if allow_base_mismatch or not recorded or not base or _base_name(recorded) == _base_name(base):
        return
    raise AdapterError(f"adapter {adapter} was trained on {recorded!r}, not {base!r}; if that is the same model renamed, "
                       "pass --allow-base-mismatch (allow_base_mismatch=True)")


def module_path(key: str) -> str:
    """The module a saved adapter tensor belongs to, relative to the model root."""
    return key.removeprefix(PEFT_PREFIX).split(LORA_MARK, 1)[0]


def renamed_adapter(adapter_config: dict[str, Any], tensors: dict[str, torch.Tensor],
                    rename: Callable[[str], str]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The adapter with every tensor name passed through ``rename`` and ``target_modules`` set to exactly the renamed
    modules that carry LoRA tensors (full paths, so LLaDA's head and a block's ``ff_out`` are never confused)."""
    renamed = {rename(key): value for key, value in tensors.items()}
    targets = sorted({module_path(key) for key in renamed if LORA_MARK in key})
    return {**adapter_config, "target_modules": targets}, renamed


def _check_shapes(model: nn.Module, tensors: dict[str, torch.Tensor], adapter: str, in_file: dict[str, str]) -> None:
    """Every LoRA tensor belongs to a module of the model, with that module's input / output size; errors name the
    tensors as the adapter file does (``in_file``: renamed key -> key in the file)."""
    unknown, wrong = [], []
    modules = dict(model.named_modules())
    for key, value in tensors.items():
        if LORA_MARK not in key:
            continue
        module = modules.get(module_path(key))
        weight = getattr(module, "weight", None)
        if weight is None or weight.dim() != 2:
            unknown.append(in_file[key])
        elif ".lora_A." in key and value.shape[-1] != weight.shape[1] or ".lora_B." in key and value.shape[0] != weight.shape[0]:
            wrong.append(f"{in_file[key]} {tuple(value.shape)} vs weight {tuple(weight.shape)}")
    if unknown:
        raise AdapterError(
            f"adapter {adapter}: {len(unknown)} tensors name no module of the model: {', '.join(sorted(unknown)[:4])}")
    if wrong:
        raise AdapterError(f"adapter {adapter}: {len(wrong)} tensors do not fit the model's shapes "
                           f"(another base?): {', '.join(sorted(wrong)[:3])}")


def load_adapter(model: nn.Module, adapter: str, *, revision: str | None = None, token: str | bool | None = None,
                 allow_base_mismatch: bool = False) -> nn.Module:
    """``model`` (a prepared student) wrapped as a ``PeftModel`` with ``adapter`` loaded, whether the adapter names
    the original modules or the native ones; raises :class:`AdapterError` naming the keys when anything does not fit."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    folder = adapter_folder(adapter, revision, token)
    adapter_config, tensors = read_adapter(folder)
    check_adapter_base(adapter_config, getattr(model.config, "_name_or_path", ""), adapter, allow_base_mismatch)
    rename = student_spec(model).module_names.to_native
    in_file = {rename(key): key for key in tensors}
    adapter_config, tensors = renamed_adapter(adapter_config, tensors, rename)
    _check_shapes(model, tensors, adapter, in_file)
    if adapter_config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"adapter {adapter}: peft_type {adapter_config['peft_type']!r}; only LoRA adapters are read")
    if not hasattr(model, "prepare_inputs_for_generation"):
        adapter_config["task_type"] = None
    config = LoraConfig.from_peft_type(**adapter_config)
    training = model.training
    peft_model = get_peft_model(model, config).train(training)  # peft switches to training mode (dropout on)
    result = set_peft_model_state_dict(peft_model, tensors)
    loaded = {name.replace(".default", "") for name, _ in peft_model.named_parameters() if LORA_MARK in name}
    missing = sorted(loaded - {key for key in tensors})
    if result.unexpected_keys or missing:
        raise AdapterError(f"adapter {adapter}: tensors not loaded {sorted(result.unexpected_keys)[:4]}, LoRA weights of "
                           f"the model the adapter lacks {missing[:4]}")
    return peft_model
