"""User-input errors and the checks every command and recipe runs before any expensive work.

A mistake in a flag, a recipe key or a path must cost seconds and one line that names what the user typed,
never a model load or a half-written folder. Every such mistake is an :class:`InputError` (a ``ValueError``),
so a command reports them all the same way; the checks shared by several commands live here, once.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

Existing = Literal["refuse", "empty", "reuse"]


class InputError(ValueError):
    """A value the user gave cannot work; the message names the flag or recipe key and the value."""


def one_line(error: BaseException) -> str:
    """A library's error message on one line, as every ``error:`` line is."""
    return " ".join(str(error).split())


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the candidates ``word`` starts (``--model``), else its closest spelling; or ``""``."""
    candidates = sorted(set(candidates))
    close = [c for c in candidates if c.startswith(word)][:3] or difflib.get_close_matches(word, candidates, n=1)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


OTHER_FORMATS = (".csv", ".tsv", ".parquet", ".arrow", ".feather", ".xlsx", ".xls", ".pkl", ".pickle", ".zip", ".tar",
                 ".gz", ".bz2", ".xz", ".zst")
"""Files that hold rows in a format other than text lines: named by their type when a reader of text takes none."""


def check_input_file(path: str | os.PathLike, label: str, suffixes: Sequence[str] = ()) -> None:
    """One line when the file a flag names is missing, a folder, or (given ``suffixes``, what its reader reads) of one
    of the :data:`OTHER_FORMATS` that none of ``suffixes`` names (``label``: the flag and the path as given). Other
    names pass (rows.ndjson, ROWS.JSONL, a file without a suffix): the reader reads content, not names."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(f"{label}: a folder, not a file.")
    if not path.is_file():
        raise InputError(f"{label}: no such file.")
    name = path.name.lower()
    if suffixes and path.suffix.lower() in OTHER_FORMATS and not name.endswith(tuple(suffixes)):
        raise InputError(f"{label}: unsupported file type '{path.suffix}' (use {', '.join(suffixes)}).")


def folder_contents(path: Path) -> str:
    """What a folder holds, for a message: its first three names, sorted, then ``...`` (empty for an empty folder)."""
    names = sorted(entry.name for entry in path.iterdir())
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def check_output_path(path: str | os.PathLike, label: str, *, folder: bool = True, existing: Existing = "reuse",
                      advice: str = "") -> Path:
    """``path`` can be written: a folder (or with ``folder=False`` a file) that can be created where it is.

    ``label`` is how the user named it (``--output out``, ``output_dir out``). An existing folder is kept
    (``reuse``: caches, resumable runs), must be empty (``empty``: a new run never mixes with an earlier one's
    files) or is refused (``refuse``: outputs replaced only on request); ``advice`` ends those two messages. An
    existing file (``folder=False``) is one the caller replaces: its folder must be writable, as files are
    replaced through a sibling and a rename (:func:`trims_hf.reports.write_atomic`).
    """
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        what = "a folder; name the file to write" if path.is_dir() else "a file, not a folder"
        raise InputError(f"{label}: {what}{advice if path.is_dir() else ''}.")
    if folder and path.is_dir() and existing == "refuse":
        raise InputError(f"{label}: already exists; choose another folder{advice}.")
    if folder and path.is_dir() and existing == "empty" and (content := folder_contents(path)):
        raise InputError(f"{label} is not empty ({content}); "
                         f"choose a new folder, delete it{advice}.")
    start = path.absolute() if folder else path.absolute().parent  # a file is written into its folder
    nearest = next(parent for parent in (start, *start.parents) if parent.exists())
    if not nearest.is_dir():
        raise InputError(f"{label}: {nearest} is a file, not a folder.")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise InputError(f"{label}: {nearest} is not writable.")
    return path


def check_apart(output: str | os.PathLike, label: str, source: str, source_label: str, made_from: str = "the data",
                folder: bool = True, inside: bool = False) -> None:
    """An output lies apart from a local input it is made from (data, a model, an adapter): an output that is the
    input or holds it would replace the input (with an overwrite); one inside a data folder would mix into the data
    (``inside`` allows that for a model's folder, as a run's checkpoints lie in it). ``source`` may be a Hub id,
    which is left alone."""
    out, data = Path(output).expanduser().resolve(), Path(source).expanduser().resolve()
    if not data.exists():
        return
    relation = ("is" if out == data else "holds" if out in data.parents
                else "lies inside" if data in out.parents and not inside else "")
    if relation:
        raise InputError(f"{label} {relation} {source_label}, {made_from} it is made from; write it "
                         f"{'to a folder apart' if folder else 'to another file'}.")


def check_output_folder(folder: str | os.PathLike, overwrite: bool = False) -> None:
    """The library's check of an output folder argument: it must not exist (unless ``overwrite``) and be creatable."""
    check_output_path(folder, f"output={folder}", existing="reuse" if overwrite else "refuse",
                      advice=" or pass overwrite=True")
