"""Run untrusted, model-written Python in a throw-away child process and say whether it passed.

Layers, each covering a gap in the others:

* a fresh ``python -I -B`` process (no user site, no ``PYTHONPATH``, no bytecode writes) in a new
  session, with a clean environment (``PATH`` only, plus ``HOME``/``TMPDIR`` pointing into the
  sandbox) and a fresh temporary directory as its working directory;
* resource limits (CPU seconds, address space, file size, open files, processes, no core dumps) set
  by the child before it reads the untrusted code, so no ``preexec_fn`` runs in a forked copy of a
  possibly multi-threaded evaluator;
* a PEP 578 audit hook, installed before the untrusted code and impossible to remove from Python,
  that refuses process creation and signals (``os.fork``, ``os.system``, ``subprocess.Popen``,
  ``os.exec*``, ``os.kill``...), ``ctypes``, sockets, and deletions, renames, permission changes and
  writes outside the sandbox directory. Unlike replacing ``os.remove`` & co. with stubs, it also covers the
  same functions reached through ``posix``, ``pathlib`` or ``shutil``;
* a wall-clock timeout after which the whole process group is killed, and a kill of the group after
  every run so that nothing the program started outlives it. ``RLIMIT_NPROC`` is set too, but the
  kernel ignores it for root (CAP_SYS_RESOURCE / CAP_SYS_ADMIN): there the audit hook and the group
  kill are what stop a fork bomb;
* stdout and stderr read through pipes with a size cap (the excess is drained and discarded).

A run passes only if the program reached its very end: the child prints a random per-run token
after the program returns, and the parent requires it as the last line of stdout. ``sys.exit(0)``
or ``os._exit(0)`` before the asserts therefore counts as a failure.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO, Literal

Status = Literal["passed", "failed", "timeout"]

_PROGRAM_FILE = "program.py"
_TAIL_BYTES = 256  # kept past the output cap so the success token is still seen

# Executed with ``python -I -B -c``; argv: program path, sandbox dir, limits (JSON). Token on stdin.
_CHILD = r'''
import json, os, resource, sys


def _make_guard(root):
    # Everything the hook consults is bound in this closure: the untrusted code could rebind
    # module globals (`import __main__`), but not these.
    blocked = frozenset({
        "os.fork", "os.forkpty", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.startfile",
        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "os.setuid", "os.chroot",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "socket.connect",
        "socket.bind",
    })
    # Allowed only on paths inside the sandbox (tempfile, for one, creates and removes files there).
    path_events = frozenset({
        "os.remove", "os.rmdir", "os.rename", "os.truncate", "os.chmod", "os.chown", "os.chflags",
        "os.link", "os.symlink", "shutil.rmtree", "shutil.chown",
    })
    blocked_imports = frozenset({"_posixsubprocess", "_ctypes", "ctypes", "subprocess", "multiprocessing"})
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    realpath, fspath, path_like, prefix = os.path.realpath, os.fspath, os.PathLike, root + os.sep

    def inside(path):
        resolved = realpath(fspath(path))
        if isinstance(resolved, bytes):
            resolved = resolved.decode("utf-8", "surrogateescape")
        return resolved == root or resolved.startswith(prefix) or resolved == "/dev/null"

    def guard(event, args):
        if event in blocked:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args[0] in blocked_imports:
            raise PermissionError(f"sandbox: import of {args[0]} is not allowed")
        if event in path_events:
            paths = [a for a in args if isinstance(a, (str, bytes, path_like))]
            if isinstance(args[0], int) or not all(map(inside, paths)):
                raise PermissionError(f"sandbox: {event} outside the sandbox is not allowed: {args!r}")
        if event == "open" and isinstance(args[0], (str, bytes)) and args[2] & write_flags and not inside(args[0]):
            raise PermissionError(f"sandbox: writing {args[0]!r} outside the sandbox is not allowed")

    return guard


def _main():
    program, root, limits = sys.argv[1], os.path.realpath(sys.argv[2]), json.loads(sys.argv[3])
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    # The token lives in this frame, not in __main__'s globals where `import __main__` would see it.
    token = sys.stdin.readline().strip()
    sys.stdin.close()
    with open(program, encoding="utf-8") as f:
        code = compile(f.read(), program, "exec")
    sys.addaudithook(_make_guard(root))
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    sys.stdout.flush()
    os.write(1, ("\n" + token + "\n").encode())


_main()
'''


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one run; the defaults suit one HumanEval/MBPP test program."""

    timeout_s: float = 10.0
    memory_bytes: int = 2 * 1024**3
    file_size_bytes: int = 16 * 1024**2
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
    """Outcome of one run. ``reason`` says why it did not pass (empty when it passed)."""

    status: Status
    reason: str
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


class _CappedReader(threading.Thread):
    """Drain a pipe, keeping its first ``cap`` bytes and its last few, so the child never blocks."""

    def __init__(self, stream: IO[bytes], cap: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.cap = stream, cap
        self.head, self.tail, self.truncated = bytearray(), b"", False

    def run(self) -> None:
        while chunk := self.stream.read1(65536):
            room = self.cap - len(self.head)
            if room > 0:
                self.head += chunk[:room]
            if len(chunk) > room:
                self.truncated = True
            self.tail = (self.tail + chunk)[-_TAIL_BYTES:]
        self.stream.close()

    def text(self) -> str:
        out = self.head.decode("utf-8", "replace")
        return out + "\n[... output truncated ...]" if self.truncated else out


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _failure_reason(returncode: int, stderr: str) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = {"SIGXCPU": "CPU time limit", "SIGXFSZ": "file size limit", "SIGKILL": "killed (limit)"}
        return f"terminated by {name}" + (f" ({hint[name]})" if name in hint else "")
    if returncode == 0:
        return "program exited before its end (sys.exit/os._exit?): success token missing"
    last = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"exit code {returncode}: {last[-1] if last else 'no error message'}"


def run_program(program: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``program`` (source text, e.g. solution + asserts) in a sandbox and report the outcome."""
    limits = limits or SandboxLimits()
    token = f"TRIMS_SANDBOX_OK_{secrets.token_hex(16)}"
    workdir = tempfile.mkdtemp(prefix="trims_sandbox_")
    try:
        path = os.path.join(workdir, _PROGRAM_FILE)
        with open(path, "w", encoding="utf-8") as f:
            f.write(program)
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        argv = [sys.executable, "-I", "-B", "-c", _CHILD, path, workdir, json.dumps(limits.rlimits())]
        start = time.monotonic()
        proc = subprocess.Popen(
            argv, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
        )
        readers = [_CappedReader(proc.stdout, limits.output_bytes), _CappedReader(proc.stderr, limits.output_bytes)]
        for reader in readers:
            reader.start()
        try:
            proc.stdin.write(token.encode() + b"\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died before reading its token; its exit status says why
        timed_out = False
        try:
            returncode: int | None = proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc.pid)
        if timed_out:
            returncode = proc.wait()
        for reader in readers:
            reader.join(timeout=2.0)
        duration = time.monotonic() - start
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    out, err = readers
    stdout, stderr = out.text(), err.text()
    if timed_out:
        return SandboxResult("timeout", f"wall-clock timeout after {limits.timeout_s:g} s", None, stdout, stderr, duration)
    if returncode == 0 and out.tail.rstrip().endswith(token.encode()):
        return SandboxResult("passed", "", 0, stdout.replace(token, "").rstrip(), stderr, duration)
    return SandboxResult("failed", _failure_reason(returncode, stderr), returncode, stdout, stderr, duration)
