"""Launching two gloo processes on CPU, one thread each, as the distributed tests do.

``accelerate launch --cpu --num_processes 2`` starts a single process (accelerate's multi-CPU mode needs
mpirun), so the tests launch with ``--multi_gpu``, i.e. torchrun; on a machine without CUDA the processes then
form a gloo group on the CPU.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_processes() -> list[str]:
    """``accelerate launch`` for two processes on a free port, before the script or ``-m module``."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
            "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]


def launch(command: list[str], cwd: Path = TESTS, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``command`` with this checkout's trims_hf (not whichever is installed), the test helpers, one thread per
    process and the Hub offline; with ``check``, fail the test on a non-zero exit, showing the output's tail."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    result = subprocess.run(command, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert not check or result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result
