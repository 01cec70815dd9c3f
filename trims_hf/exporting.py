"""A trained student in the form the field loads: merged weights or an adapter, in the original model's names.

``merged``: base + adapter merged, saved in the base's original layout (:mod:`trims_hf.students.layout`), which
Fast-dLLM, dLLM, d3LLM and SGLang read with the original remote code. ``adapter``: the LoRA tensors and
``target_modules`` renamed to the original code's modules (full paths, so LLaDA's LM head ``model.transformer.ff_out``
and a block's MLP output ``model.transformer.blocks.N.ff_out`` stay apart) and ``task_type`` unset, so
``PeftModel.from_pretrained(original_model, folder)`` loads every tensor. Both come with a model card saying how to
load them either way; :func:`push_folder` uploads the folder.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, ModelCard, ModelCardData
from safetensors.torch import save_file

from .data.hub import METADATA_KEY
from .students import STUDENTS, detect_student_kind
from .students.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    BASE_FINGERPRINT,
    adapter_folder,
    check_adapter_base,
    read_adapter,
    renamed_adapter,
)

FORMATS = ("merged", "adapter")
CARD = "README.md"


def export_merged(base: str, adapter: str, output: Path, *, model_kind: str | None = None,
                  allow_base_mismatch: bool = False, **load_kwargs: Any) -> Path:
    """Merge ``adapter`` into ``base`` and save it in the base's layout (original for LLaDA / Dream checkpoints), with
    the tokenizer the run trained with (its output folder's, else the base's), so the folder loads on its own.

    On a machine without an accelerator it names DeepSpeed's CPU accelerator for the process (``DS_ACCELERATOR=cpu``
    unless set): saving asks accelerate to unwrap the model, which imports DeepSpeed where it is installed, and DeepSpeed
    left to guess prints that it found no GPU."""
    import torch

    from .distributed import name_cpu_accelerator
    from .students import load_student

    if not torch.accelerator.is_available():
        name_cpu_accelerator()
    model = load_student(base, model_kind, adapter=adapter, allow_base_mismatch=allow_base_mismatch, **load_kwargs)
    model.merge_and_unload().save_pretrained(output)
    tokenizer = run_tokenizer(adapter, base)
    if tokenizer is None:
        print(f"note: no tokenizer written to {output}: neither the adapter's folder nor the base has one that loads "
              "without remote code; pass the base's to `trims eval --tokenizer-name-or-path`.", file=sys.stderr)
    else:
        tokenizer.save_pretrained(output)
    return output


def run_tokenizer(adapter: str, base: str) -> Any:
    """The tokenizer saved beside ``adapter`` (a folder or Hub repo: ``trims train`` saves the student's, mask token
    included), else ``base``'s; None when neither has one that loads without remote code."""
    from .students import load_student_tokenizer

    for source in (adapter, base):
        try:
            return load_student_tokenizer(source)
        except (OSError, ValueError, KeyError, ImportError):  # no tokenizer files, remote code, a missing package
            continue
    return None


def export_adapter(base: str, adapter: str, output: Path, *, model_kind: str | None = None,
                   allow_base_mismatch: bool = False) -> Path:
    """Write ``adapter`` with the original module names of ``base``'s family (tensors, ``target_modules``); a base that
    is no original checkpoint of its family (a plain causal LM trained as a student) has the native names as its own,
    so they stay. The base is checked by name only (its weights are not read here); the adapter's record of its base's
    weights goes along, so loading the export with trims_hf checks them."""
    from transformers import PreTrainedConfig

    config_dict, _ = PreTrainedConfig.get_config_dict(base)
    spec = STUDENTS[model_kind or detect_student_kind(config_dict)]
    folder = adapter_folder(adapter)
    adapter_config, tensors = read_adapter(folder)
    check_adapter_base(adapter_config, base, adapter, allow_base_mismatch)
    native_config, native = renamed_adapter(adapter_config, tensors, spec.module_names.to_native)
    original_config, original = (renamed_adapter(native_config, native, spec.module_names.to_original)
                                 if spec.is_original(config_dict) else (native_config, native))
    # The original classes' forwards take neither peft's causal-LM arguments nor (Dream) its generation hooks.
    original_config["task_type"] = None
    output.mkdir(parents=True, exist_ok=True)
    save_file({key: value.contiguous() for key, value in original.items()}, output / ADAPTER_WEIGHTS,
              metadata={"format": "pt"})
    (output / ADAPTER_CONFIG).write_text(json.dumps(original_config, indent=2, sort_keys=True) + "\n")
    if (folder / BASE_FINGERPRINT).is_file():  # the base's weights, by native names: load_student still checks them
        shutil.copyfile(folder / BASE_FINGERPRINT, output / BASE_FINGERPRINT)
    return output


def base_is_original(base: str, model_kind: str | None = None) -> bool:
    """Whether ``base`` is an original checkpoint of its family (LLaDA, Dream...), whose layout an export keeps; a
    plain causal LM or masked LM trained as a student has transformers' own layout and no original code."""
    from transformers import PreTrainedConfig

    config_dict, _ = PreTrainedConfig.get_config_dict(base)
    return STUDENTS[model_kind or detect_student_kind(config_dict)].is_original(config_dict)


def export_card(base: str, adapter: str, output: Path, export_format: str, repo_id: str | None = None,
                original_layout: bool = True) -> ModelCard:
    """The card of an exported folder: base model, the TRIMS settings the adapter's own card recorded, and how to load
    it with trims_hf and, where the base is an original checkpoint (``original_layout``), with the original code."""
    name = repo_id or str(output)  # what loads it: the Hub id, else the folder as the user named it
    trained = Path(adapter).expanduser() / CARD
    settings = ModelCard.load(trained).data.to_dict().get(METADATA_KEY, {}) if trained.is_file() else {}
    data = ModelCardData(base_model=base, library_name="peft" if export_format == "adapter" else "transformers",
                         tags=["trims", "masked-diffusion", "text-generation"], **{METADATA_KEY: {**settings,
                         "exported_from": adapter, "export_format": export_format}})
    if export_format == "adapter":
        original = (f'base = AutoModel.from_pretrained("{base}", trust_remote_code=True)\n'
                    f'model = PeftModel.from_pretrained(base, "{name}")')
        ours = f'model = load_student("{base}", adapter="{name}")'
        imports = "from peft import PeftModel\nfrom transformers import AutoModel"
    else:
        original = f'model = AutoModel.from_pretrained("{name}", trust_remote_code=True)'
        ours = f'model = load_student("{name}")'
        imports = "from transformers import AutoModel"
    listed = "\n".join(f"- `{key}`: {value}" for key, value in sorted(settings.items())) or "- not recorded"
    layout = ("in the original model's module names, so the original modeling code (and tools built on it: Fast-dLLM, "
              "dLLM, d3LLM, SGLang)\nloads it as it is." if original_layout else "in transformers' own layout: the "
              "base is no original checkpoint of a diffusion\nfamily, so no original code reads it, and transformers' "
              "Auto classes would load it causal or headless;\nload it with trims_hf, which makes it bidirectional.")
    original_section = f"""## Load with the original code

```python
{imports}

{original}
```

""" if original_layout else ""
    body = f"""---
{data.to_yaml()}
---

# {repo_id or Path(output).resolve().name}

{"A LoRA adapter for" if export_format == "adapter" else "The merged weights of"} the masked diffusion language model
`{base}` fine-tuned with TRIMS (trajectory-ranked instruction masked supervision), exported from `{adapter}`
{layout}

## TRIMS settings

{listed}

{original_section}## Load with trims_hf (no remote code)

```python
from trims_hf import load_student

{ours}
```
"""
    return ModelCard(body)


def push_folder(folder: Path, repo_id: str, token: str | None = None) -> str:
    """Create ``repo_id`` if needed and upload ``folder``; the URL of the commit."""
    api = HfApi(token=token)
    api.create_repo(repo_id, exist_ok=True)
    return str(api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="Export with trims_hf"))


def export(base: str, adapter: str, output: str | Path, export_format: str = "merged", *, model_kind: str | None = None,
           allow_base_mismatch: bool = False, push_to_hub: str | None = None, token: str | None = None) -> Path:
    """Export base + adapter as ``export_format`` (:data:`FORMATS`) into ``output`` with its card; push it to
    ``push_to_hub`` when given. ``model_kind`` is the student family (detected from ``base``'s config; a plain causal
    LM trained as a student needs it, as :func:`~trims_hf.load_student`'s ``kind``)."""
    if export_format not in FORMATS:
        raise ValueError(f"format={export_format!r}: choose one of {', '.join(FORMATS)}")
    output = Path(output)
    writer = export_merged if export_format == "merged" else export_adapter
    writer(base, adapter, output, model_kind=model_kind, allow_base_mismatch=allow_base_mismatch)
    export_card(base, adapter, output, export_format, push_to_hub, base_is_original(base, model_kind)).save(output / CARD)
    if push_to_hub:
        push_folder(output, push_to_hub, token)
    return output
