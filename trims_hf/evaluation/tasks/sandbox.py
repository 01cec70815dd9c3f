"""Run untrusted, model-written Python against a task's tests and decide, out of its reach, whether it passed.

Two processes per run, wired by pipes the parent creates:

* the *solution* process runs the model's code, then serves calls to the names it defined;
* the *judge* process runs the task's tests, in which every name the solution defined (except
  builtins' names) is a proxy: calling it asks the solution process and gets back a plain value
  (None, bool, int, float, complex, str, bytes and lists, tuples, dicts, sets of them), or an
  opaque handle for anything else, which the tests can call or iterate over (the solution runs
  ``iter()`` and ``next()``, one item per request). The verdict is the judge's exit status.

So the solution can neither read nor forge the verdict (it shares no memory, frame, file or fd
with the judge), and an object with an always-true ``__eq__`` never reaches a test: it arrives as
a handle, equal only to itself. What the solution can still do is answer each call with any plain
value, which is no more than a solution that hard-codes the expected outputs.

Each process is isolated, in layers:

* bubblewrap (``bwrap``) by default: no network, own pid/ipc/uts/cgroup/mount namespaces, uid
  65534 in its own user namespace (no further user namespaces), only the system and Python
  directories mounted, read-only, plus a size-capped tmpfs as its working directory (so nothing
  is ever written to the evaluator's disk), a clean environment, a new session, death with the
  parent. Where bwrap is missing or cannot run, a one-time warning names what is missing and the
  runs fall back to plain processes (``isolation="process"``);
* a fresh ``python -I -B`` in a new session, with a clean environment (one BLAS / OpenMP thread);
* resource limits (CPU, address space, file size, open files, processes, no core dumps) set by the
  child before it reads any untrusted code;
* in the solution process, a PEP 578 audit hook (second layer) refusing process creation, signals,
  ctypes calls, sockets and writes outside its working directory through Python's own calls (it stops
  mistakes and plain attacks; a determined program reaches below it, so the namespaces are the
  boundary); without bubblewrap, where it is the only layer, also the import of ctypes, subprocess and
  multiprocessing, so there a solution that imports numpy, scipy, pandas, sympy or asyncio fails (the
  reference graders, and bubblewrap, run it);
* a wall-clock timeout for the whole run, after which both processes are killed; they are killed
  after every run anyway, and output is read through size-capped pipes.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

Status = Literal["passed", "failed", "timeout"]
Isolation = Literal["auto", "bubblewrap", "process"]

_SANDBOX_DIR = "/sandbox"  # the working directory inside bubblewrap (a tmpfs)
_BWRAP_UID = "65534"  # "nobody"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_KILL_GRACE_S = 2.0
INSTALL_BUBBLEWRAP = "sudo apt-get install bubblewrap"
"""How a user gets bubblewrap (Debian/Ubuntu), said wherever its absence matters."""

@functools.cache
def _child_script(name: str) -> str:
    """The program of a sandboxed child: the shared wire format (``_sandbox_codec.py``) then ``_sandbox_<name>.py``.

    Real files, so linters and readers see them as code, but read here and handed to the child as
    ``python -I -B -c TEXT``: under bubblewrap only the system and Python folders are mounted, and an editable or
    source checkout of trims_hf lies outside them, so the child never opens a file of ours, and nothing new is
    mounted into the sandbox (the security model is unchanged: the child holds only this text, its stdin and
    the two RPC pipes).
    """
    folder = Path(__file__).parent
    return (folder / "_sandbox_codec.py").read_text() + "\n\n" + (folder / f"_sandbox_{name}.py").read_text()


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one run (each of its two processes); the defaults suit one HumanEval/MBPP problem."""

    timeout_s: float = 10.0
    memory_bytes: int = 2 * 1024**3
    file_size_bytes: int = 16 * 1024**2
    disk_bytes: int = 64 * 1024**2
    """Size of the writable tmpfs under bubblewrap (the process fallback has no such cap)."""
    max_open_files: int = 64
    max_processes: int = 64
    output_bytes: int = 64 * 1024

    def rlimits(self) -> dict[str, int]:
        """RLIMIT_* name -> value; CPU seconds follow the wall timeout so a busy loop is killed too."""
        return {
            "RLIMIT_CPU": math.ceil(self.timeout_s) + 1,
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_FSIZE": self.file_size_bytes,
            "RLIMIT_NOFILE": self.max_open_files,
            "RLIMIT_NPROC": self.max_processes,
            "RLIMIT_CORE": 0,
        }


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one run. ``reason`` says why it did not pass (empty when it passed); ``isolation``
    says which sandbox ran it ("bubblewrap" or "process")."""

    status: Status
    reason: str
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    isolation: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"


class SandboxUnavailable(RuntimeError):
    """``isolation="bubblewrap"`` was asked for, but bwrap cannot run here."""


class _CappedReader(threading.Thread):
    """Drain a pipe, keeping its first ``cap`` bytes, so the child never blocks on a full pipe."""

    def __init__(self, stream: IO[bytes], cap: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.head, self.truncated = bytearray(), False
        self.start()

    def run(self) -> None:
        while chunk := self.stream.read1(65536):
            room = self.cap - len(self.head)
            if room > 0:
                self.head += chunk[:room]
            self.truncated |= len(chunk) > room
        self.stream.close()

    def text(self, deadline: float) -> str:
        """What was read by ``deadline`` (a ``time.monotonic()`` value) at the latest."""
        self.join(timeout=max(0.0, deadline - time.monotonic()))
        out = self.head.decode("utf-8", "replace")
        return out + "\n[... output truncated ...]" if self.truncated else out


def bubblewrap_command(limits: SandboxLimits) -> list[str]:
    """The bwrap command line up to the program: namespaces, uid, read-only mounts, a capped tmpfs."""
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--uid", _BWRAP_UID, "--gid", _BWRAP_UID,
            "--die-with-parent", "--new-session", "--clearenv", "--proc", "/proc", "--dev", "/dev"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    python_dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    for path in sorted(python_dirs):
        argv += ["--ro-bind", path, path]
    argv += ["--size", str(limits.disk_bytes), "--tmpfs", _SANDBOX_DIR, "--chdir", _SANDBOX_DIR]
    for key, value in _child_env(_SANDBOX_DIR).items():
        argv += ["--setenv", key, value]
    return argv + ["--"]


def _child_env(home: str) -> dict[str, str]:
    """A clean environment; one thread for BLAS and OpenMP, so numpy's pools fit the address-space limit on any
    number of cores."""
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            **dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")}


@functools.cache
def bubblewrap_problem() -> str | None:
    """Why bubblewrap cannot isolate programs here (None when it can), found by running a trivial one."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    argv = bubblewrap_command(SandboxLimits()) + [sys.executable, "-I", "-B", "-c", "print('ok')"]
    try:
        probe = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not start a program ({e})"
    if probe.returncode != 0 or probe.stdout.strip() != b"ok":
        last = probe.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap could not start a program ({last[-1] if last else f'exit code {probe.returncode}'})"
    return None


@functools.cache
def _warn_fallback(problem: str) -> None:
    warnings.warn(
        f"trims_hf sandbox: {problem} ({INSTALL_BUBBLEWRAP}); model code runs WITHOUT network, pid, mount and user "
        "namespaces (only rlimits, an audit hook and a separate judge process protect the evaluator), and solutions "
        "that import ctypes or subprocess (numpy, scipy, pandas, sympy, asyncio) fail",
        RuntimeWarning, stacklevel=4,
    )


def resolve_isolation(isolation: Isolation = "auto") -> Literal["bubblewrap", "process"]:
    """The isolation a run will get: bubblewrap when usable (``auto`` warns once when it falls back)."""
    if isolation not in ("auto", "bubblewrap", "process"):
        raise ValueError(f"isolation must be 'auto', 'bubblewrap' or 'process', not {isolation!r}")
    if isolation == "process":
        return "process"
    problem = bubblewrap_problem()
    if problem is None:
        return "bubblewrap"
    if isolation == "bubblewrap":
        raise SandboxUnavailable(f"isolation='bubblewrap' asked for, but {problem}")
    _warn_fallback(problem)
    return "process"


class _Child:
    """One sandboxed Python child: started in its own session, its stdin fed, its output capped."""

    def __init__(self, script: str, stdin_text: str, fds: tuple[int, int], limits: SandboxLimits,
                 prefix: list[str], workdir: str, args: tuple[str, ...] = ()) -> None:
        argv = prefix + [sys.executable, "-I", "-B", "-c", script, json.dumps(limits.rlimits()), *map(str, fds), *args]
        self.proc = subprocess.Popen(
            argv, cwd=workdir, env=_child_env(workdir), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, pass_fds=fds,
        )
        self.out = _CappedReader(self.proc.stdout, limits.output_bytes)
        self.err = _CappedReader(self.proc.stderr, limits.output_bytes)
        threading.Thread(target=self._feed, args=(stdin_text,), daemon=True).start()

    def _feed(self, text: str) -> None:
        try:
            self.proc.stdin.write(text.encode("utf-8", "surrogateescape"))
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass  # the child died before reading its input; its exit status says why

    def kill(self) -> int:
        """Kill the child's whole process group (under bwrap, its pid namespace dies with it)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is already gone
        return self.proc.wait()


def _failure_reason(returncode: int, stderr: str) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = {"SIGXCPU": "CPU time limit", "SIGXFSZ": "file size limit", "SIGKILL": "killed (limit)"}
        return f"terminated by {name}" + (f" ({hint[name]})" if name in hint else "")
    last = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"exit code {returncode}: {last[-1] if last else 'no error message'}"


def run_tests(solution: str, tests: str, limits: SandboxLimits | None = None, isolation: Isolation = "auto",
              entry_points: Collection[str] = ()) -> SandboxResult:
    """Run ``solution`` and ``tests`` in two sandboxed processes; passed means the tests ran to their end.

    In ``tests`` every top-level name the solution defines is visible (as a proxy that calls into the
    solution's process), as is ``__solution__``, a namespace of the same proxies that the tests' own
    definitions cannot shadow. Names of builtins (``abs``, ``sorted``...) stay the builtins, so a
    solution cannot fake the tests' helpers, unless listed in ``entry_points`` (the functions under
    test, e.g. MBPP's ``sum``).
    """
    limits = limits or SandboxLimits()
    kind = resolve_isolation(isolation)
    workdir = tempfile.mkdtemp(prefix="trims_sandbox_")  # the fallback's working directory; bwrap uses a tmpfs
    prefix = bubblewrap_command(limits) if kind == "bubblewrap" else []
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    start = time.monotonic()
    try:
        try:
            solver = _Child(_child_script("solution"), solution, (request_r, reply_w), limits, prefix, workdir, (kind,))
            judge = _Child(_child_script("judge"), json.dumps(sorted(entry_points)) + "\n" + tests, (request_w, reply_r), limits,
                           prefix, workdir)
        finally:
            for fd in (request_r, request_w, reply_r, reply_w):
                os.close(fd)  # only the children hold the RPC pipes, so either one's death ends the other's reads
        try:
            returncode: int | None = judge.proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
        judge.kill()
        solver_code = solver.kill()
        duration = time.monotonic() - start
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    deadline = time.monotonic() + _KILL_GRACE_S  # one grace period for all four pipes to drain
    stdout = solver.out.text(deadline) + judge.out.text(deadline)
    judge_err, solver_err = judge.err.text(deadline), solver.err.text(deadline)
    stderr = solver_err + judge_err
    if returncode is None:
        return SandboxResult("timeout", f"wall-clock timeout after {limits.timeout_s:g} s", None,
                             stdout, stderr, duration, kind)
    if returncode == 0:
        return SandboxResult("passed", "", 0, stdout, stderr, duration, kind)
    reason = _failure_reason(returncode, judge_err)
    if "the solution process ended" in reason:
        reason += f" [solution: {_failure_reason(solver_code, solver_err)}]"
    return SandboxResult("failed", reason, returncode, stdout, stderr, duration, kind)


def run_program(program: str, limits: SandboxLimits | None = None, isolation: Isolation = "auto") -> SandboxResult:
    """Run a whole program (e.g. code with its own asserts): passed means it ran to its end.

    Its asserts run inside the untrusted process, so unlike :func:`run_tests` this verdict is only
    as strong as the program's honesty; grading uses :func:`run_tests`.
    """
    return run_tests(program, "", limits, isolation)
