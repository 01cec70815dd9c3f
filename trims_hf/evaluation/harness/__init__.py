"""trims_hf students in lm-evaluation-harness: the ``trims`` model, offline task configs, one command.

``python -m trims_hf.evaluation.harness <lm_eval flags>`` runs the harness with the ``trims`` model registered and
this package's task folder on ``--include_path``. The folder adds ``*_local`` groups that run the
harness's own GSM8K / MATH-500 / MBPP tasks unchanged except that their data are read from local files
(``TRIMS_HARNESS_DATA`` or ``--metadata '{"data_dir": ...}'``, a folder laid out like ``gsm8k/train.jsonl``,
``gsm8k/test.jsonl``, ``math500/test.jsonl``, ``mbpp/mbpp.jsonl``). The Hub tasks stay the default.
Nothing here imports ``lm_eval``; :mod:`trims_hf.evaluation.harness.model` does (install ``trims_hf[lm_eval]``).
"""

from __future__ import annotations

import os
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
"""The folder to pass to ``lm_eval --include_path`` for the ``*_local`` task groups."""

DATA_DIR_ENV = "TRIMS_HARNESS_DATA"

LOCAL_FILES = {"gsm8k": {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"},
               "minerva_math500": {"test": "math500/test.jsonl"},
               "mbpp": {"full": "mbpp/mbpp.jsonl"}}
"""Per ``*_local`` task family (the task names' prefix), the files under the data folder its loader
(tasks/local_data.py) reads, by split; the command checks them all before any model loads."""


def data_file(relative: str, data_dir: str | None = None) -> Path:
    """The local data file ``relative`` under ``data_dir`` (default: ``$TRIMS_HARNESS_DATA``); fails if absent."""
    root = data_dir or os.environ.get(DATA_DIR_ENV)
    if not root:
        raise FileNotFoundError(
            f"local harness tasks need their data folder: set {DATA_DIR_ENV} or pass --metadata '{{\"data_dir\": ...}}'"
        )
    path = Path(root) / relative
    if not path.is_file():
        raise FileNotFoundError(f"local harness task data not found: {path}")
    return path


__all__ = ["DATA_DIR_ENV", "LOCAL_FILES", "TASKS_DIR", "data_file"]
