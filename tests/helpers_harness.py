"""lm-eval's task index cut to what the harness tests run. lm-eval indexes every task YAML it ships (about 14,000
files, 15 s or more a process on a CPU) before it looks one up; the tests' tasks are the package's ``*_local`` groups
over its GSM8K tasks, whose results do not depend on which other tasks are indexed. The command's own test
(test_harness.py, ``python -m trims_hf.evaluation.harness``) keeps the full index."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def gsm8k_task_manager(**kwargs: Any):
    """A ``TaskManager`` that indexes lm-eval's GSM8K folder and the package's ``*_local`` tasks only; ``kwargs`` are
    TaskManager's other arguments (``include_path`` and ``include_defaults`` are set here)."""
    from lm_eval.tasks import manager  # the class's own module: it stays when lm_eval.tasks' name is replaced

    from trims_hf.evaluation.harness import TASKS_DIR

    kwargs.pop("include_path", None), kwargs.pop("include_defaults", None)
    folders = [str(Path(manager.__file__).parent / "gsm8k"), str(TASKS_DIR)]
    return manager.TaskManager(include_path=folders, include_defaults=False, **kwargs)
