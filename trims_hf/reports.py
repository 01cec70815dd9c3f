"""What every report shares: the one markdown table writer, the library versions a number was made with, the
atomic file write every result and record goes through, and the libraries' progress bars kept out of the console."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

VERSIONED_PACKAGES = ("torch", "transformers", "peft", "datasets")
"""Packages whose versions move decoding and training numbers; recorded with every result file and model card."""


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table; cells are written as given, so callers format their own numbers."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def library_versions(*extra: str) -> dict[str, str]:
    """``{package: version}`` for trims_hf, :data:`VERSIONED_PACKAGES` and the ``extra`` packages (e.g. deepspeed
    for a benchmark), read from the installed metadata (importing nothing), so a result can be reproduced."""
    from . import __version__

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return {"trims_hf": __version__, **{name: installed(name) for name in (*VERSIONED_PACKAGES, *extra)}}


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` through a temporary sibling and a rename, so a crash never leaves half a file (the sibling named
    by process, so processes writing one file on shared storage never rename each other's half-written one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    os.replace(partial, path)
    return path


def write_json(path: Path, document: Any, indent: int | None = 2) -> Path:
    """Write ``document`` as JSON with :func:`write_atomic`. NaN and Infinity are not JSON (strict readers reject the
    file): one raises here, before anything is written, so a result file never holds them."""
    return write_atomic(path, json.dumps(document, indent=indent, allow_nan=False))


def weights_fingerprint(model: Any, sample: int | None = None) -> str:
    """A hash of every parameter and buffer (names, dtypes, shapes, bytes): the same weights, bit for bit, give
    the same value, so runs can show they start from the same weights and saved work is reused only for them.
    ``sample`` hashes each tensor's first and last ``sample`` values only, for a key that must stay cheap on a
    model of billions of weights (any training moves those too); an offloaded (meta) tensor counts by its name,
    dtype and shape."""
    import torch  # here: the rest of this module serves torch-free commands

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        if tensor.is_meta:
            continue
        flat = tensor.detach().reshape(-1)
        if sample is not None and flat.numel() > 2 * sample:
            flat = torch.cat([flat[:sample], flat[-sample:]])
        digest.update(flat.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


@contextmanager
def library_bars_silenced(silenced: bool = True) -> Iterator[None]:
    """transformers' and datasets' own progress bars (loading and writing weights, parquet shards, dataset splits and
    maps) off inside the block and as they were after it; ``silenced=False`` leaves them alone. A study's stages and
    an evaluation keep their own bars: the libraries' nested ones, dozens a stage, would bury them (and
    ``--no-progress`` means no bar at all)."""
    import datasets
    from transformers.utils import logging as transformers_logging

    datasets_had, transformers_had = not datasets.are_progress_bars_disabled(), transformers_logging.is_progress_bar_enabled()
    if silenced:
        datasets.disable_progress_bars()
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if datasets_had:
            datasets.enable_progress_bars()
        if transformers_had:
            transformers_logging.enable_progress_bar()
