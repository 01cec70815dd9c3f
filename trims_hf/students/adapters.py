"""LoRA adapters in either naming onto a student, every tensor loaded or one error naming what did not fit.

Adapters trained with the field's tools (dLLM, the original remote code) name LLaDA's modules as the original code
does (``model.transformer.blocks.N.q_proj``...); ours name the native Llama modules. ``peft`` given the wrong naming
wraps some modules, loads nothing and only warns, and an adapter of another base decodes as a different model.
:func:`load_adapter` renames original names to native ones through the one table of
:mod:`trims_hf.students.names`, checks the recorded base and every shape before the model is touched, and refuses
any tensor that does not land in the model. A name says little (two repositories can share one; a folder can be
refilled), so ``trims train`` also records a sample of the base's own weights beside the adapter
(:data:`BASE_FINGERPRINT`), and :func:`load_adapter` refuses a base whose weights are not those.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import one_line
from .registry import student_spec

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""Prefix of every tensor name in a saved peft adapter (the model root follows it)."""
LORA_MARK = ".lora_"
"""Start of the LoRA parameter part of a tensor name (``.lora_A.weight``, ``.lora_B.weight``...)."""
BASE_FINGERPRINT = "trims_base.json"
"""The file beside an adapter that records a sample of the weights of the base it was trained on."""
FINGERPRINT_FORMAT = 1
FINGERPRINT_SAMPLES = 16
"""Values read per base tensor, evenly spaced over it: a few thousand for an 8B model, read in milliseconds."""
_WRAPPER_PARTS = re.compile(r"\.(base_layer|original_module|token_adapter)(?=\.)")
"""The module levels peft inserts above a base weight (LoRA layers, ``modules_to_save``, trainable tokens)."""
_ADAPTER_PARTS = (LORA_MARK, ".modules_to_save.", ".trainable_tokens_")
"""Marks of the tensors an adapter trains or saves, which are not the base's."""


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
                                      allow_patterns=[ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_FINGERPRINT]))
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


def base_fingerprint(model: nn.Module) -> dict[str, Any]:
    """A sample of ``model``'s weights (the base: a peft-wrapped model reads as its base, the adapter's tensors left
    out): per parameter, its shape, its dtype and :data:`FINGERPRINT_SAMPLES` evenly spaced values (as float32,
    little-endian, in hex, which holds an integer weight's values exactly too; none for a weight offloaded to the meta
    device, which holds no values). Written beside an adapter by :func:`write_base_fingerprint`, compared by
    :func:`base_difference`."""
    samples = {}
    for name, parameter in model.named_parameters():
        if any(part in name for part in _ADAPTER_PARTS) or not _readable(parameter.dtype) or not parameter.numel():
            continue
        flat = parameter.detach().reshape(-1)
        count = min(FINGERPRINT_SAMPLES, flat.numel())
        positions = torch.arange(count, device=flat.device) * flat.numel() // count
        samples[_WRAPPER_PARTS.sub("", name.removeprefix(PEFT_PREFIX))] = {
            "shape": list(parameter.shape), "dtype": str(parameter.dtype).removeprefix("torch."),
            **({"packed": True} if hasattr(parameter, "quant_state") else {}),
            "values": None if flat.is_meta else flat[positions].float().cpu().numpy().astype("<f4").tobytes().hex()}
    return {"format": FINGERPRINT_FORMAT, "samples": samples}


def training_base_fingerprint(model: nn.Module) -> dict[str, Any] | None:
    """:func:`base_fingerprint` of a peft-wrapped ``model`` about to be trained, or None: not an adapter, weights no
    process holds whole (ZeRO-3 partitions, FSDP shards, DTensors), or no base weight to sample.
    Taken before training, while FSDP has not yet sharded the model, it records the base that the saved adapter goes
    on: its frozen weights, and the values a trained non-adapter weight had, which the adapter does not save."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        return None
    for name, parameter in model.named_parameters():
        if hasattr(parameter, "ds_id") or "_fsdp_wrapped_module" in name or _is_dtensor(parameter):
            return None
    fingerprint = base_fingerprint(model)
    return fingerprint if fingerprint["samples"] else None


def _is_dtensor(tensor: torch.Tensor) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def write_base_fingerprint(folder: Path, fingerprint: dict[str, Any]) -> None:
    """Write ``fingerprint`` (:func:`base_fingerprint`) into the adapter folder ``folder``."""
    from ..reports import write_atomic

    write_atomic(Path(folder) / BASE_FINGERPRINT, json.dumps(fingerprint, separators=(",", ":")) + "\n")


def _readable(dtype: torch.dtype) -> bool:
    """Whether ``dtype``'s values read as float32 and, if floating point, have a spacing (not complex, not packed
    sub-byte floats such as ``float4_e2m1fn_x2``)."""
    if dtype.is_complex:
        return False
    try:
        return not dtype.is_floating_point or torch.finfo(dtype).eps > 0
    except (TypeError, RuntimeError, NotImplementedError):
        return False


def _dtype(sample: dict[str, Any]) -> torch.dtype:
    dtype = getattr(torch, sample["dtype"], None)
    if not isinstance(dtype, torch.dtype) or not _readable(dtype):
        raise ValueError(f"dtype {sample['dtype']!r}")
    return dtype


def _sampled(sample: dict[str, Any]) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(bytes.fromhex(sample["values"]), dtype="<f4").astype(np.float32))


def _rounding(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s values at ``magnitude`` (subnormal spacing below its smallest normal)."""
    info = torch.finfo(dtype)
    return info.eps * torch.exp2(torch.floor(torch.log2(magnitude))).clamp(min=info.tiny)


def _checked(fingerprint: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, torch.dtype]]:
    """The samples of ``fingerprint`` and each one's dtype, or ``ValueError`` on a malformed record."""
    samples = fingerprint["samples"]
    if not isinstance(samples, dict) or not all(isinstance(sample, dict) for sample in samples.values()):
        raise ValueError("samples is not a mapping of parameter names to samples")
    return samples, {name: _dtype(sample) for name, sample in samples.items()}


def _agreeing(was: torch.Tensor, was_dtype: torch.dtype, now: torch.Tensor, now_dtype: torch.dtype) -> torch.Tensor:
    """Which sampled values read the same stored value, each rounded to the dtype it was loaded in: bit for bit in one
    dtype; across floating-point dtypes within half a spacing of each, an infinite value only where the other is the
    same infinity or overflows to it, NaN where both are."""
    if was_dtype == now_dtype:
        return was.view(torch.int32) == now.view(torch.int32)
    finite = was.isfinite() & now.isfinite()
    magnitude = torch.where(finite, torch.maximum(was.abs(), now.abs()), 1.0)
    close = (was - now).abs() <= (_rounding(magnitude, was_dtype) + _rounding(magnitude, now_dtype)) / 2
    overflowed = (was.to(now_dtype).float() == now) | (now.to(was_dtype).float() == was)
    return torch.where(finite, close, (overflowed & (was.isinf() | now.isinf())) | (was.isnan() & now.isnan()))


def _comparable(old: dict[str, Any], was: torch.dtype, new: dict[str, Any], now: torch.dtype) -> bool:
    """Whether two samples of one weight hold comparable values: the same dtype and packing, or two unpacked floating
    point dtypes. A quantized weight (integer, or packed 4-bit data stored in a float dtype: bitsandbytes'
    ``quant_storage``) against a full one is not comparable."""
    packed = bool(old.get("packed")), bool(new.get("packed"))
    if packed[0] != packed[1]:
        return False
    return was == now or not packed[0] and was.is_floating_point and now.is_floating_point


def base_difference(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
    """How the base ``current`` differs from the one ``recorded`` (both :func:`base_fingerprint`), or None when it
    is the same checkpoint. Both read the same stored values, each rounded to the dtype it was loaded in, so a
    sampled value agrees when it is bit for bit the recorded one (same dtype), or within half a spacing of each dtype
    of it (float32, bfloat16, float16 loads of one checkpoint): every value must agree, and a fine-tune moves
    nearly all of them beyond that. A quantized weight on one side and a full one on the other (an adapter trained
    on a 4-bit base, loaded on the full one) are not compared (:func:`_comparable`). Raises
    ``ValueError``/``KeyError`` on a malformed record."""
    (old, old_dtypes), (new, new_dtypes) = _checked(recorded), _checked(current)
    if set(old) != set(new):
        gone, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
        return (f"its parameters differ (the recorded base had {', '.join(gone[:2]) or 'no others'}; this one has "
                f"{', '.join(extra[:2]) or 'no others'})")
    compared = [name for name in sorted(new) if _comparable(old[name], old_dtypes[name], new[name], new_dtypes[name])]
    shapes = [name for name in compared if list(old[name]["shape"]) != list(new[name]["shape"])]
    if shapes:
        return f"{shapes[0]} is {tuple(new[shapes[0]]['shape'])}, was {tuple(old[shapes[0]]['shape'])}"
    differing, total, first = 0, 0, None
    for name in compared:
        if old[name]["values"] is None or new[name]["values"] is None:  # offloaded when recorded or now: not compared
            continue
        was, now = _sampled(old[name]), _sampled(new[name])
        if was.shape != now.shape:
            raise ValueError(f"{name}: {was.numel()} values")
        agree = _agreeing(was, old_dtypes[name], now, new_dtypes[name])
        differing, total = differing + int((~agree).sum()), total + now.numel()
        if first is None and not agree.all():
            first = name
    if differing:
        return f"{differing} of {total} sampled weights differ beyond rounding ({first} first)"
    return None


def check_base_weights(folder: Path, model: nn.Module, adapter: str, allow_base_mismatch: bool) -> bool:
    """Refuse ``model`` as the base of the adapter in ``folder`` when the adapter recorded a base of other weights
    (:data:`BASE_FINGERPRINT`; adapters trained elsewhere record none, and keep only the name check); True when the
    record was read and ``model`` holds its weights."""
    path = Path(folder) / BASE_FINGERPRINT
    if allow_base_mismatch or not path.is_file():
        return False
    unreadable = f"adapter {adapter}: {BASE_FINGERPRINT} is not a record of a base this version reads"
    try:
        recorded = json.loads(path.read_text())
    except ValueError:
        raise AdapterError(f"{unreadable} (not JSON); delete it to load on the name check alone") from None
    if not isinstance(recorded, dict) or recorded.get("format") != FINGERPRINT_FORMAT:
        found = recorded.get("format") if isinstance(recorded, dict) else None
        raise AdapterError(f"{unreadable} (format {found!r}, this version reads {FINGERPRINT_FORMAT}); upgrade trims_hf")
    current = base_fingerprint(model)
    try:
        difference = base_difference(recorded, current)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise AdapterError(f"{unreadable} ({type(error).__name__}: {one_line(error)}); delete it to load on the name "
                           "check alone") from None
    if difference is not None:
        raise AdapterError(" ".join(
            f"adapter {adapter} was trained on a base with other weights than "
            f"{getattr(model.config, '_name_or_path', '') or 'this model'!s}: {difference}; if that is intended, pass "
            "--allow-base-mismatch (allow_base_mismatch=True)".split()))
    return True


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


PEFT_READS_A_RENAMED_ATTRIBUTE = r"`is_gradient_checkpointing` is deprecated"
"""The FutureWarning transformers 5 raises each time peft (0.21) reads a model's ``is_gradient_checkpointing``, since
renamed ``is_activation_checkpointing``: peft's own use of the old name, which no setting of the user's changes."""


def get_lora_model(model: nn.Module, config: Any) -> nn.Module:
    """``peft.get_peft_model(model, config)`` without :data:`PEFT_READS_A_RENAMED_ATTRIBUTE` (every other warning
    passes), so that each train, eval and export run does not end its output with a warning nobody can act on."""
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PEFT_READS_A_RENAMED_ATTRIBUTE, category=FutureWarning)
        return get_peft_model(model, config)


PEFT_RENAMES_THE_BASE = r"The PEFT config's `base_model_name_or_path` was renamed"
"""The UserWarning peft raises when it loads an adapter onto a base of another name or path than the one recorded
(a Hub id and its local copy, a relative and an absolute path), asking to "ensure that the correct base model is
loaded": :func:`load_adapter` has ensured it when the adapter's record of its base's weights matched
(:func:`check_base_weights`). Without a record, the name check alone compares last path parts, and peft's warning
stays."""


def load_adapter(model: nn.Module, adapter: str, *, revision: str | None = None, token: str | bool | None = None,
                 allow_base_mismatch: bool = False) -> nn.Module:
    """``model`` (a prepared student) wrapped as a ``PeftModel`` with ``adapter`` loaded, whether the adapter names
    the original modules or the native ones; raises :class:`AdapterError` naming the keys when anything does not fit,
    or when the adapter recorded a base of other weights (:func:`check_base_weights`) unless ``allow_base_mismatch``."""
    from peft import LoraConfig, set_peft_model_state_dict

    folder = adapter_folder(adapter, revision, token)
    adapter_config, tensors = read_adapter(folder)
    check_adapter_base(adapter_config, getattr(model.config, "_name_or_path", ""), adapter, allow_base_mismatch)
    weights_checked = check_base_weights(folder, model, adapter, allow_base_mismatch)
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
    with warnings.catch_warnings():
        if weights_checked:
            warnings.filterwarnings("ignore", message=PEFT_RENAMES_THE_BASE, category=UserWarning)
        peft_model = get_lora_model(model, config).train(training)  # peft switches to training mode (dropout on)
    result = set_peft_model_state_dict(peft_model, tensors)
    loaded = {name.replace(".default", "") for name, _ in peft_model.named_parameters() if LORA_MARK in name}
    missing = sorted(loaded - {key for key in tensors})
    if result.unexpected_keys or missing:
        raise AdapterError(f"adapter {adapter}: tensors not loaded {sorted(result.unexpected_keys)[:4]}, LoRA weights of "
                           f"the model the adapter lacks {missing[:4]}")
    return peft_model
