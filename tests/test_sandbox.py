"""Hostile programs must fail (or time out) without harming the evaluator or anything outside the
sandbox; honest programs must pass."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trims_hf.tasks.sandbox import SandboxLimits, run_program

FAST = SandboxLimits(timeout_s=3.0)


def test_passing_program_passes_and_its_output_is_kept() -> None:
    result = run_program("assert sum([1, 2]) == 3\nprint('hello')", FAST)
    assert result.passed, result.reason
    assert result.stdout.strip() == "hello"
    assert result.reason == ""


def test_failed_assert_fails_with_the_exception_as_reason() -> None:
    result = run_program("assert 1 + 1 == 3, 'wrong sum'", FAST)
    assert result.status == "failed"
    assert "AssertionError: wrong sum" in result.reason


def test_infinite_loop_times_out_on_the_wall_clock() -> None:
    start = time.monotonic()
    result = run_program("while True:\n    pass", FAST)
    assert result.status == "timeout"
    assert time.monotonic() - start < FAST.timeout_s + 2


def test_sleeping_child_is_killed_at_the_timeout() -> None:
    result = run_program("import time\ntime.sleep(60)", SandboxLimits(timeout_s=1.0))
    assert result.status == "timeout"
    assert result.duration_s < 3


@pytest.mark.parametrize(
    "program",
    [
        "import os\nwhile True:\n    os.fork()",
        "import posix\nwhile True:\n    posix.fork()",
        "import subprocess\nsubprocess.Popen(['sleep', '60'])",
        "import os\nos.system('sleep 60')",
        "import multiprocessing",
        "import ctypes\nctypes.CDLL(None).fork()",
    ],
    ids=["os.fork", "posix.fork", "subprocess", "os.system", "multiprocessing", "ctypes"],
)
def test_process_creation_is_refused(program: str) -> None:
    result = run_program(program, FAST)
    assert result.status == "failed"
    assert "PermissionError: sandbox:" in result.reason


def test_huge_allocation_fails_with_memory_error() -> None:
    result = run_program("block = bytearray(10 * 1024**3)\nprint(len(block))", FAST)
    assert result.status == "failed"
    assert "MemoryError" in result.reason


@pytest.mark.parametrize(
    "attack",
    [
        "import os\nos.remove(TARGET)",
        "import os\nos.unlink(TARGET)",
        "import pathlib\npathlib.Path(TARGET).unlink()",
        "import shutil\nshutil.rmtree(os.path.dirname(TARGET))",
        "import os\nos.rename(TARGET, TARGET + '.moved')",
        "open(TARGET, 'w').write('overwritten')",
        "import os\nos.chmod(TARGET, 0)",
    ],
    ids=["remove", "unlink", "pathlib", "rmtree", "rename", "overwrite", "chmod"],
)
def test_files_outside_the_sandbox_are_untouched(tmp_path: Path, attack: str) -> None:
    target = tmp_path / "keep.txt"
    target.write_text("precious")
    mode = target.stat().st_mode
    result = run_program(f"import os\nTARGET = {str(target)!r}\n{attack}", FAST)
    assert result.status == "failed"
    assert "outside the sandbox" in result.reason
    assert target.read_text() == "precious"
    assert target.stat().st_mode == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize(
    "exit_call",
    ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"],
    ids=["sys.exit", "os._exit", "SystemExit"],
)
def test_exiting_before_the_asserts_counts_as_failed(exit_call: str) -> None:
    result = run_program(f"{exit_call}\nassert False", FAST)
    assert result.status == "failed"
    assert "success token missing" in result.reason


def test_printing_a_fake_success_token_does_not_pass() -> None:
    result = run_program("import os\nprint('TRIMS_SANDBOX_OK_' + '0' * 32)\nos._exit(0)", FAST)
    assert result.status == "failed"


@pytest.mark.parametrize(
    "program",
    [
        "import os\nos.kill(os.getppid(), 9)",
        "import os\nos.killpg(os.getpgid(os.getppid()), 9)",
        "import signal, threading\nsignal.pthread_kill(threading.main_thread().ident, 9)",
    ],
    ids=["kill", "killpg", "pthread_kill"],
)
def test_signals_are_refused_and_the_evaluator_survives(program: str) -> None:
    result = run_program(program, FAST)
    assert result.status == "failed"
    assert "PermissionError: sandbox:" in result.reason
    os.kill(os.getpid(), 0)  # still alive
    assert run_program("assert True", FAST).passed


def test_megabytes_of_output_are_capped() -> None:
    limits = SandboxLimits(timeout_s=5.0, output_bytes=4096)
    result = run_program("import sys\nfor _ in range(200):\n    sys.stdout.write('x' * 100_000)\nprint()", limits)
    assert result.passed, result.reason
    assert len(result.stdout) < 4096 + 100
    assert result.stdout.endswith("[... output truncated ...]")
    noisy_failure = run_program("import sys\nsys.stderr.write('e' * 5_000_000)\nassert False", limits)
    assert noisy_failure.status == "failed"
    assert len(noisy_failure.stderr) < 4096 + 100


def test_child_sees_a_clean_environment_and_a_private_working_directory() -> None:
    program = (
        "import os\n"
        "assert set(os.environ) <= {'PATH', 'HOME', 'TMPDIR', 'LANG'}, sorted(os.environ)\n"
        "assert os.path.basename(os.getcwd()).startswith('trims_sandbox_')\n"
        "open('scratch.txt', 'w').write('ok')\n"
        "import tempfile\n"
        "with tempfile.NamedTemporaryFile() as f:\n"
        "    f.write(b'x')\n"
        "os.remove('scratch.txt')\n"
        "print(os.getcwd())\n"
    )
    os.environ["TRIMS_SANDBOX_TEST_SECRET"] = "leak"
    try:
        result = run_program(program, FAST)
    finally:
        del os.environ["TRIMS_SANDBOX_TEST_SECRET"]
    assert result.passed, result.stderr
    assert not Path(result.stdout.strip()).exists()  # the sandbox directory is removed afterwards
