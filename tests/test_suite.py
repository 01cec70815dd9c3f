"""The suite runs as the README says: CI runs the README's test command (and its inner loop), and the pytest-xdist
workers that command starts share the CPUs instead of each spinning OpenMP threads on all of them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from conftest import CALLERS_THREADS, MAX_WORKERS, WORKERS, pytest_xdist_auto_num_workers

from trims_hf.determinism import usable_cpus

ROOT = Path(__file__).resolve().parents[1]


def readme_test_command() -> str:
    """The command of the README's "The two commands" block that runs pytest, without its comment."""
    section = (ROOT / "README.md").read_text().split("## The two commands", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    (command,) = [line.split("#", 1)[0].strip() for line in block.splitlines() if "pytest" in line]
    return command


def test_ci_runs_the_readmes_test_command_and_its_inner_loop():
    command = readme_test_command()
    assert command.startswith("python -m pytest")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line.lstrip().startswith("#")]
    assert f'{command} | tee "$log"' in ci  # the whole suite, with the full data beside the clone
    assert f'{command} -m "not slow"' in ci  # the inner loop, in a bare clone


def test_each_xdist_worker_computes_on_its_share_of_the_cpus():
    if WORKERS == 1:
        pytest.skip("a serial session; the README's test command runs the suite on pytest-xdist workers (-n auto)")
    assert os.environ["PYTEST_XDIST_WORKER"].startswith("gw")
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])  # set before torch loaded: launches inherit it
    if CALLERS_THREADS is None:
        assert torch.get_num_threads() == max(1, usable_cpus() // WORKERS)
    assert pytest_xdist_auto_num_workers(None) == min(usable_cpus(), MAX_WORKERS)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="the platform reports no CPU affinity")
def test_the_cpus_counted_are_those_the_process_may_run_on(monkeypatch):
    """Under taskset or a container's CPU share the workers and their threads count the CPUs allowed, not the machine's."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cpus() == 1
