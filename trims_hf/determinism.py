"""The CPU settings that decide float results, pinned before torch loads, so a run depends on as little of the machine
as can be pinned.

ATen's vectorised kernels (dispatched on the CPU's instruction set), MKL's and oneDNN's code paths and the number of
threads each fix an order of floating-point operations; another order changes the last bits (~1e-8), and training
amplifies them until every cell of a results table moves. Pinning the AVX2 paths (present on every x86-64 CPU since
2013, AVX-512 ones included) and a thread count was meant to make the demo's numbers a property of the code alone;
they still differ between CPU models (docs/demo.md gives two machines' tables), so they reproduce on one CPU model
with one thread count.
The code paths are chosen when torch loads, so they are set in the environment first (this module imports nothing
heavy); the thread count can change later and is set with ``torch.set_num_threads``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

DEFAULT_THREADS = 2
"""The development machine's cores: the README's demo numbers are measured with this many threads."""


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity where the platform reports one (a container's or ``taskset``'s
    share, which ``os.cpu_count`` ignores), else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


PINNED_ENVIRONMENT = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
"""Read when torch, MKL and oneDNN load: ATen's kernel dispatch, MKL's conditional numerical reproducibility branch,
oneDNN's highest instruction set."""


WAIT_POLICY = {"OMP_WAIT_POLICY": "PASSIVE"}
"""OpenMP threads that wait for work sleep instead of spinning. A run holds its thread count fixed (it decides the
float results), so on a machine where other processes take cores, a spinning thread burns the time its partner
needs: with one of two cores kept busy, ``trims demo --fast`` took 2.1x its time alone with GNU OpenMP's default
spinning and 0.99x sleeping (and with other jobs running too, 321 s against 70 s, 136 s of CPU time against 22 s).
On a machine that runs nothing else, sleeping costs ``--fast`` about 18% (19.9 s against 16.2 s); ``GOMP_SPINCOUNT``
brings the spinning back. It orders no arithmetic, so no number changes. Read when the OpenMP runtime loads (with
torch); a policy the user set wins."""


def sleep_while_waiting() -> None:
    """Set :data:`WAIT_POLICY` for this process and its children, unless the user set one; before torch loads."""
    for name, value in WAIT_POLICY.items():
        os.environ.setdefault(name, value)


def run_pinned(module: str, argv: Sequence[str]) -> int | None:
    """Make the rest of this command run under :func:`pinned_environment`.

    Before torch loads, the variables are set here and None says "go on in this process"; likewise when they were
    set before torch loaded. Otherwise (``main()`` called from Python after importing torch, e.g. in a notebook) they
    can no longer take effect here: ``python -m module argv`` runs in a child process that has them, and its exit code
    is returned.
    """
    if "torch" not in sys.modules:
        os.environ.update(PINNED_ENVIRONMENT)
        return None
    if all(os.environ.get(name) == value for name, value in PINNED_ENVIRONMENT.items()):
        return None
    env = {**os.environ, **PINNED_ENVIRONMENT}
    return subprocess.run([sys.executable, "-m", module, *argv], env=env, check=False).returncode
