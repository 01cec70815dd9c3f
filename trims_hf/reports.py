"""What every report shares: the one markdown table writer and the library versions a number was made with."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

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
