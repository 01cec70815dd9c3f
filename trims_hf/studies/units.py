"""Resumable units of work (:class:`Units`): how a study (:class:`~trims_hf.studies.study.Study`) resumes, each unit
a folder finished when its key file names it and the fingerprint of what it depends on."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import InputError, folder_contents
from ..reports import write_atomic
from .protocol import PROTOCOL_FILE, StudyProtocol

KEY_FILE = "cache-key.json"
STUDY_MARK = "trims-study.json"
"""Written at the top of a study's folder when its run starts: the folder is a study's, whose units it may rebuild."""
UNIT_FORMAT = 2
"""The shape of what units write (2: ``data/train.jsonl`` holds prompt/completion rows); part of every unit's key, so
a folder made by code that wrote another shape is rebuilt, never misread."""


def check_study_folder(folder: Path, label: str) -> None:
    """A study rebuilds its units' folders in place (``data/``, ``score/``, ``report/``...), so it runs in a new or
    empty folder, or one a study made (its mark, its ``protocol.json``, or a finished ``data/`` unit of a run made
    before the mark), never over a user's folders of the same names. ``label``: the flag and path as the user gave
    them."""
    if not folder.is_dir() or not (content := folder_contents(folder)):
        return
    if any((folder / name).is_file() for name in (STUDY_MARK, PROTOCOL_FILE, f"data/{KEY_FILE}")):
        return
    raise InputError(f"{label} is not empty ({content}) and holds "
                     "no study's run, whose folders a study would replace: choose a new folder, or an earlier run's to "
                     "continue it.")


def claim_study_folder(folder: Path, label: str) -> None:
    """Check ``folder`` (:func:`check_study_folder`), create it and mark it as a study's."""
    check_study_folder(folder, label)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / STUDY_MARK).is_file():
        write_atomic(folder / STUDY_MARK, json.dumps({"made_by": "trims_hf.studies"}))


class OutOfBudget(Exception):
    """A study's time budget ran out between two units of work; running it again continues."""


class StudyInterrupted(KeyboardInterrupt):
    """Ctrl-C inside a study: the finished units are kept, and the unit cut short starts over (an evaluation inside
    it continues from its records) when the same command runs again. Its message says where it stopped, in the
    user's terms, for the command to print in one line."""


@dataclasses.dataclass
class Units:
    """Resumable units of work of one study: each unit is a folder, finished when its key file (written last, after
    ``unit.json`` with its wall time and measurements) names the unit and the fingerprint of what it depends on (the
    protocol's, or its stage's part of it: :meth:`StudyProtocol.fingerprint`). A unit cut short, or finished under
    another fingerprint, is started over; no unit starts after ``deadline`` (``time.monotonic()``).

    Units are how a study resumes; the two finer resumes inside one unit do another job: an evaluation continues
    problem by problem from its records, and ``trims score`` chunk by chunk, because each is one long job that a
    command-line user also runs on its own."""

    protocol: StudyProtocol
    device: str
    deadline: float = math.inf
    ran: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    progress: Callable[[], str] | None = None
    """What the header line of a unit that starts adds (:meth:`Study.progress`: where the run is, the time left)."""
    current: str | None = None
    """The unit started and not yet finished (None between units)."""

    def key(self, name: str, stage: str | None) -> dict[str, str]:
        return {"unit": name, "protocol": self.protocol.fingerprint(stage), "format": UNIT_FORMAT}

    def finished(self, folder: Path, name: str, stage: str | None = None) -> bool:
        """Whether ``folder`` holds the unit finished under this protocol (an unreadable key file: not finished)."""
        path = folder / KEY_FILE
        try:
            return path.is_file() and json.loads(path.read_text()) == self.key(name, stage)
        except ValueError:
            return False

    def unit(self, folder: Path, name: str, stage: str | None = None, timed: bool = True, expected_s: float = 0.0) -> bool:
        """True when ``folder`` must be (re)built now (it is then empty); raises :class:`OutOfBudget` unless not
        ``timed`` when the unit, taking ``expected_s``, would end past the deadline: a unit killed by the caller's
        own time limit is lost, one not started is only postponed."""
        if self.finished(folder, name, stage):
            self.skipped.append(name)
            return False
        if timed and time.monotonic() + expected_s > self.deadline:
            raise OutOfBudget(f"{name} (expected {expected_s:.0f} s)" if expected_s else name)
        print(f"\n== {name} =={self.progress() if self.progress else ''}", flush=True)
        self.ran.append(name)
        self.current = name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return True

    def done(self, folder: Path, name: str, started: float, info: Mapping[str, Any] | None = None,
             stage: str | None = None) -> None:
        """Record what the unit measured and its wall time since ``started`` (``time.perf_counter()``), then mark
        it finished."""
        key = self.key(name, stage)
        record = {**key, "device": self.device, "wall_s": round(time.perf_counter() - started, 2), **(info or {})}
        write_atomic(folder / "unit.json", json.dumps(record, indent=1, default=str))
        write_atomic(folder / KEY_FILE, json.dumps(key, indent=2))
        self.current = None
