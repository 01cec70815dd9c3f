"""``python -m trims_hf.evaluation.harness`` with lm-eval's task index cut to GSM8K and the ``*_local`` tasks
(helpers_harness.py says why); run by tests/test_data_parallel.py, alone and under ``accelerate launch``.

Usage: ``python tests/harness_script.py <the harness command's flags>``.
"""

from __future__ import annotations

import sys

import lm_eval.tasks
from helpers_harness import gsm8k_task_manager

from trims_hf.cli import leave_process_group
from trims_hf.evaluation.harness.__main__ import main

if __name__ == "__main__":
    lm_eval.tasks.TaskManager = gsm8k_task_manager  # where the harness's run and the command's check look it up
    code = main(sys.argv[1:])
    leave_process_group()  # as the command's own entry does before it exits
    sys.exit(code)
