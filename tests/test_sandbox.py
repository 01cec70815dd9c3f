"""Hostile programs must fail (or time out) without harming the evaluator or anything outside the
sandbox, and must not be able to fake a pass; honest programs must pass, also right after an attack."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DATA

from trims_hf.evaluation.tasks import HumanEvalTask, MBPPTask, sandbox
from trims_hf.evaluation.tasks.sandbox import (
    SandboxLimits,
    SandboxUnavailable,
    bubblewrap_command,
    bubblewrap_problem,
    run_program,
    run_tests,
)

FAST = SandboxLimits(timeout_s=3.0)
BOTH = ["bubblewrap", "process"]
needs_bwrap = pytest.mark.skipif(bubblewrap_problem() is not None,
                                reason=f"bubblewrap unusable: {bubblewrap_problem()} ({sandbox.INSTALL_BUBBLEWRAP})")
ISOLATIONS = [pytest.param("bubblewrap", marks=needs_bwrap), "process"]


def in_inner_loop(cases: dict[str, str], *kept: str) -> list:
    """A family of hostile programs as parameters: those named in ``kept`` run in the inner loop too, the others in the
    whole suite only (each is a sandboxed grading, two Python processes, and an honest grading after it)."""
    assert set(kept) <= set(cases), set(kept) - set(cases)
    return [pytest.param(program, id=name, marks=() if name in kept else pytest.mark.slow)
            for name, program in cases.items()]


GOOD = "def square(x):\n    return x * x\n"
TESTS = "assert square(3) == 9\nassert square(-2) == 4\n"
SECRET = "trims-test-secret-4f1c"
CHILD_ENV = {"HOME", "LANG", "PATH", "PWD", "TMPDIR", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}
"""All a child's environment holds: where it lives, its language, one thread for BLAS and OpenMP."""


class Victims:
    """A file and a folder outside the sandbox that no program may change."""

    def __init__(self, root: Path) -> None:
        self.root, self.file, self.folder = root, root / "victim.txt", root / "victim_dir"
        self.file.write_text("precious")
        self.folder.mkdir()
        (self.folder / "inner.txt").write_text("also precious")
        self.snapshot = self._state()

    def _state(self) -> dict[str, tuple[bytes, int]]:
        return {str(p.relative_to(self.root)): (p.read_bytes() if p.is_file() else b"", p.stat().st_mode)
                for p in sorted(self.root.rglob("*"))}

    def intact(self) -> bool:
        return self._state() == self.snapshot


@pytest.fixture
def victims(tmp_path: Path) -> Victims:
    return Victims(tmp_path)


@pytest.fixture
def victim_process() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def assert_attack_failed(result: sandbox.SandboxResult, isolation: str) -> None:
    assert result.status in ("failed", "timeout"), result
    assert result.isolation == isolation
    os.kill(os.getpid(), 0)  # the evaluator is alive
    assert run_tests(GOOD, TESTS, FAST, isolation).passed  # and still grades honest code


# -- honest programs ------------------------------------------------------------------------------
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_correct_solution_passes_with_its_output_and_isolation_recorded(isolation: str) -> None:
    result = run_tests(GOOD + "print('hello')\n", TESTS, FAST, isolation)
    assert result.passed, result.reason
    assert (result.stdout.strip(), result.reason, result.isolation) == ("hello", "", isolation)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_plain_values_cross_faithfully_and_exceptions_keep_their_type(isolation: str) -> None:
    solution = (
        "def echo(x):\n    return x\n"
        "def boom(kind):\n    raise {'v': ValueError, 'k': KeyError}[kind]('nope')\n"
        "class Node:\n    def __init__(self, v):\n        self.v = v\n"
        "def value(node):\n    return node.v\n"
    )
    tests = (
        "for v in [None, True, 0, -7, 2**200, 1.5, float('inf'), 'é', b'\\x00', 1j, [1, (2, 3)], (1,), {1: [2]},"
        " {(1, 2): 'a'}, {1, 2}, frozenset({3})]:\n"
        "    got = echo(v)\n"
        "    assert got == v and type(got) is type(v), (got, v)\n"
        "assert echo((1, 2)) != [1, 2]\n"
        "try:\n    boom('v')\nexcept ValueError as e:\n    assert 'nope' in str(e)\nelse:\n    raise AssertionError\n"
        "try:\n    boom('k')\nexcept KeyError:\n    pass\nelse:\n    raise AssertionError\n"
        "node = Node(5)\n"
        "assert value(node) == 5 and node != 5\n"  # objects stay in the solution, reachable through handles
        "assert echo(int) is int and echo([str]) == [str]\n"  # builtin types cross by name
    )
    result = run_tests(solution, tests, FAST, isolation)
    assert result.passed, result.stderr


def test_subclasses_of_plain_types_cross_as_their_content() -> None:
    solution = (
        "import collections, math\n"
        "Point = collections.namedtuple('Point', 'x y')\n"
        "def count(xs):\n    return collections.Counter(xs)\n"
        "def point():\n    return Point(1, 2)\n"
        "def group():\n    d = collections.defaultdict(list)\n    d['a'].append(1)\n    return d\n"
    )
    tests = ("assert count('aab') == {'a': 2, 'b': 1} and type(count('a')) is dict\n"
             "assert point() == (1, 2) and group() == {'a': [1]}\n"
             "assert math.isclose(math.pi, 3.141592653589793)\n")  # the solution's `import math`, the judge's copy
    result = run_tests(solution, tests, FAST)
    assert result.passed, result.stderr


def test_only_the_functions_under_test_may_take_a_builtins_name() -> None:
    solution = "def sum(a, b):\n    return a * b\n"
    assert run_tests(solution, "assert sum(2, 3) == 6", FAST, entry_points=["sum"]).passed
    result = run_tests(solution, "assert sum(2, 3) == 6", FAST)
    assert result.status == "failed" and "TypeError" in result.reason  # the builtin sum, not the solution's


def test_a_module_reaches_the_tests_only_under_its_own_name() -> None:
    assert run_tests("import heapq as hq\n" + GOOD, TESTS, FAST).passed  # an alias is simply not exposed
    result = run_tests("import cmath as math\n" + GOOD, "assert math.isclose(square(2), 4)", FAST)
    assert result.status == "failed"
    assert "NameError: name 'math' is not defined" in result.reason


@pytest.mark.parametrize("module", in_inner_loop({name: name for name in ("numpy", "pandas", "sympy", "asyncio")},
                                                  "numpy"))
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_solution_may_import_what_the_reference_graders_allow_where_namespaces_bound_it(module: str,
                                                                                         isolation: str) -> None:
    """These modules import ctypes or subprocess while loading: under bubblewrap they load (only what they would
    run is refused); without namespaces the audit hook refuses the import, and the reason says so."""
    result = run_tests(f"import {module}\n" + GOOD, TESTS, SandboxLimits(timeout_s=20.0), isolation)
    if isolation == "bubblewrap":
        assert result.passed, result.reason
    else:
        assert result.status == "failed"
        assert re.search(r"PermissionError: sandbox: import of (ctypes|subprocess) is not allowed", result.reason)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_completions_main_block_does_not_run(isolation: str) -> None:
    """As in the reference graders' ``exec(program, {})``: ``__name__`` is builtins', so a self-test under
    ``if __name__ == "__main__":`` (a wrong one, or one reading stdin) does not decide the verdict."""
    main = "def module_name():\n    return __name__\nif __name__ == '__main__':\n    assert square(3) == 10\n    input()\n"
    assert run_tests(GOOD + main, TESTS + "assert module_name() == 'builtins'\n", FAST, isolation).passed
    wrong = run_tests(GOOD + main, "assert square(3) == 10\n", FAST, isolation)
    assert wrong.status == "failed" and "AssertionError" in wrong.reason


def test_an_iterable_the_solution_returns_reaches_the_tests_as_its_items() -> None:
    """A map, generator or iterator arrives as a handle the tests can iterate over (``list``, ``sorted``, ``in``,
    unpacking, ``next``, a loop that stops early), the solution running ``iter`` and ``next``, as the reference
    graders read the object itself; it stays unequal to a list, as there."""
    solution = "class Box:\n    pass\ndef doubled(xs):\n    return map(lambda x: 2 * x, xs)\n" \
               "def upto(n):\n    yield from range(n)\ndef pair():\n    return iter([Box(), 1])\n" \
               "def opaque():\n    return object()\nimport itertools\ndef counting():\n    return itertools.count()\n"
    tests = "assert list(doubled([1, 2])) == [2, 4] and tuple(doubled([3])) == (6,) and 4 in doubled([2])\n" \
            "assert sorted(upto(3)) == [0, 1, 2]\nbox, one = pair()\nassert one == 1 and repr(box).startswith('<solution')\n" \
            "assert next(upto(2)) == 0 and next(iter(counting())) == 0\n" \
            "for i in counting():\n    if i == 3:\n        break\n"  # an endless iterator, read as far as the test goes
    assert run_tests(solution, tests, FAST).passed
    for wrong, reason in [("assert list(upto(3)) == [0, 1]", "AssertionError"),
                          ("assert upto(2) == [0, 1]", "AssertionError"),
                          ("list(opaque())", "TypeError: 'object' object is not iterable"),
                          ("next(opaque())", "TypeError: 'object' object is not an iterator")]:
        result = run_tests(solution, wrong, FAST)
        assert result.status == "failed" and reason in result.reason, (wrong, result.reason)


def test_exact_numbers_and_ranges_the_solution_returns_reach_the_tests_by_value() -> None:
    """A Fraction, Decimal or range compares with the number or range a test states, as where the reference graders
    run the solution in the tests' own process (a handle would be unequal to every one of them)."""
    solution = "from fractions import Fraction\nfrom decimal import Decimal\ndef half():\n    return Fraction(1, 2)\n" \
               "def price():\n    return Decimal('2.50')\ndef evens(n):\n    return range(0, n, 2)\n"
    tests = "from fractions import Fraction\nfrom decimal import Decimal\n" \
            "assert half() == 0.5 and half() == Fraction(2, 4) and type(half()) is Fraction\n" \
            "assert price() == Decimal('2.5') and str(price()) == '2.50'\n" \
            "assert evens(7) == range(0, 7, 2) and list(evens(7)) == [0, 2, 4, 6] and evens(7)[-1] == 6\n"
    assert run_tests(solution, tests, FAST).passed
    result = run_tests(solution, "assert half() == 0.25", FAST)
    assert result.status == "failed" and "AssertionError" in result.reason


def test_failed_assert_fails_with_the_exception_as_reason() -> None:
    result = run_tests(GOOD, "assert square(3) == 10, 'wrong square'", FAST)
    assert result.status == "failed"
    assert "AssertionError: wrong square" in result.reason
    whole = run_program("assert 1 + 1 == 3, 'wrong sum'", FAST)
    assert "AssertionError: wrong sum" in whole.reason


def test_exception_while_defining_the_solution_is_the_reason() -> None:
    result = run_tests("1 / 0\n" + GOOD, TESTS, FAST)
    assert result.status == "failed"
    assert "ZeroDivisionError" in result.reason


def test_humaneval_and_mbpp_grades_record_the_isolation() -> None:
    humaneval = HumanEvalTask(FAST)
    example = humaneval.load(limit=1)[0]
    right = f"```python\n{example.fields['prompt']}{example.fields['canonical_solution']}\n```"
    grade = humaneval.grade(example, right, execute_code=True)
    assert grade["correct"] and grade["isolation"] == sandbox.resolve_isolation()
    wrong = humaneval.grade(example, "```python\nreturn True\n```", execute_code=True)
    assert not wrong["correct"] and wrong["isolation"] == grade["isolation"]
    mbpp = MBPPTask(limits=FAST)
    tree_task = next(e for e in mbpp.load(str(DATA / "mbpp" / "mbpp.jsonl"))
                     if e.id == "367")  # test_setup_code builds trees from the solution's Node class
    assert mbpp.grade(tree_task, tree_task.fields["code"], execute_code=True)["correct"]


# -- limits ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize(
    "program",
    ["while True:\n    pass", "import time\ntime.sleep(60)",
     "def square(x):\n    while True:\n        pass\n"],
    ids=["busy-loop", "sleep", "busy-call"],
)
@pytest.mark.slow
def test_stalls_time_out_on_the_wall_clock(isolation: str, program: str) -> None:
    limits = SandboxLimits(timeout_s=1.5)
    start = time.monotonic()
    result = run_tests(program, TESTS, limits, isolation)
    assert result.status == "timeout"
    assert time.monotonic() - start < limits.timeout_s + 2.5
    assert_attack_failed(result, isolation)


PROCESS_CREATION = {
    "os.fork": "import os\nwhile True:\n    os.fork()",
    "posix.fork": "import posix\nwhile True:\n    posix.fork()",
    "subprocess": "import subprocess\nsubprocess.Popen(['sleep', '60'])",
    "os.system": "import os\nos.system('sleep 60')",
    "multiprocessing": "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    "ctypes": "import ctypes\nctypes.CDLL(None).fork()",
    "asyncio": "import asyncio\nasyncio.run(asyncio.create_subprocess_exec('sleep', '60'))",
}


@pytest.mark.parametrize("program", in_inner_loop(PROCESS_CREATION, "subprocess", "ctypes"))
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_process_creation_is_refused(program: str, isolation: str) -> None:
    result = run_program(program, FAST, isolation)
    assert result.status == "failed"
    assert "PermissionError: sandbox:" in result.reason


def test_huge_allocation_fails_with_memory_error() -> None:
    result = run_program("block = bytearray(10 * 1024**3)\nprint(len(block))", FAST)
    assert result.status == "failed"
    assert "MemoryError" in result.reason


def test_megabytes_of_output_are_capped() -> None:
    limits = SandboxLimits(timeout_s=5.0, output_bytes=4096)
    result = run_program("import sys\nfor _ in range(200):\n    sys.stdout.write('x' * 100_000)\nprint()", limits)
    assert result.passed, result.reason
    assert len(result.stdout) < 4096 + 100
    assert result.stdout.endswith("[... output truncated ...]")
    noisy_failure = run_program("import sys\nsys.stderr.write('e' * 5_000_000)\nassert False", limits)
    assert noisy_failure.status == "failed"
    assert len(noisy_failure.stderr) < 2 * (4096 + 100)


@needs_bwrap
def test_disk_fill_hits_the_tmpfs_cap_and_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host_tmp = tmp_path / "tmp"
    host_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(host_tmp))
    limits = SandboxLimits(timeout_s=10.0, disk_bytes=8 * 1024**2, file_size_bytes=1024**2)
    fill = "for i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * (1024**2 - 1))\n" + GOOD
    result = run_tests(fill, TESTS, limits, "bubblewrap")
    assert result.status == "failed"
    assert "No space left on device" in result.reason
    assert list(host_tmp.iterdir()) == []  # no working directory left behind, nothing written to the host
    assert_attack_failed(result, "bubblewrap")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_child_sees_a_clean_environment_and_a_private_working_directory(
    isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIMS_SANDBOX_TEST_SECRET", SECRET)
    program = (
        "import os, tempfile\n"
        f"assert set(os.environ) <= {CHILD_ENV!r}, sorted(os.environ)\n"
        "open('scratch.txt', 'w').write('ok')\n"
        "with tempfile.NamedTemporaryFile() as f:\n"
        "    f.write(b'x')\n"
        "os.remove('scratch.txt')\n"
        "print(os.getcwd())\n"
    )
    result = run_program(program, FAST, isolation)
    assert result.passed, result.stderr
    workdir = Path(result.stdout.strip())
    if isolation == "bubblewrap":
        assert workdir == Path("/sandbox")  # a tmpfs inside the sandbox, never on the host
    else:
        assert workdir.name.startswith("trims_sandbox_") and not workdir.exists()  # removed afterwards


# -- attacks: each must fail, leave the victims intact, and leave the evaluator able to grade --------
@needs_bwrap
def test_evaluator_secrets_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMS_SANDBOX_TEST_SECRET", SECRET)
    solution = (
        "import os\n"
        "def leak():\n"
        "    found = [repr(dict(os.environ))]\n"
        "    pids = [p for p in os.listdir('/proc') if p.isdigit()] + [str(os.getppid()), 'self', '1', EVALUATOR]\n"
        "    for pid in pids:\n"
        "        try:\n"
        "            found.append(open(f'/proc/{pid}/environ', 'rb').read().decode('latin-1'))\n"
        "        except OSError:\n"
        "            pass\n"
        "    return '\\n'.join(found)\n"
        f"EVALUATOR = {str(os.getpid())!r}\n"
        "print(leak())\n"
    )
    result = run_tests(solution, f"assert {SECRET!r} in leak()", FAST, "bubblewrap")
    assert SECRET not in result.stdout + result.stderr
    assert_attack_failed(result, "bubblewrap")


FD_ATTACKS = {
    "unlink-dir_fd": "os.unlink('victim.txt', dir_fd=os.open(ROOT, os.O_RDONLY))",
    "unlink-inner-dir_fd": "os.unlink('inner.txt', dir_fd=os.open(ROOT + '/victim_dir', os.O_RDONLY))",
    "rmdir-dir_fd": "import shutil\nshutil.rmtree('victim_dir', dir_fd=os.open(ROOT, os.O_RDONLY))",
    "write-opener": "d = os.open(ROOT, os.O_RDONLY)\n"
                    "open('victim.txt', 'w', opener=lambda p, f: os.open(p, f, dir_fd=d)).write('pwned')",
    "create-dir_fd": "os.write(os.open('new.txt', os.O_CREAT | os.O_WRONLY, dir_fd=os.open(ROOT, os.O_RDONLY)), b'x')",
    "rename-dir_fd": "d = os.open(ROOT, os.O_RDONLY)\nos.rename('victim.txt', 'moved.txt', src_dir_fd=d, dst_dir_fd=d)",
    "plain-remove": "os.remove(ROOT + '/victim.txt')",
    "chmod": "os.chmod(ROOT + '/victim.txt', 0)",
}


@needs_bwrap
@pytest.mark.parametrize("attack", in_inner_loop(FD_ATTACKS, "unlink-dir_fd", "write-opener"))
def test_files_outside_cannot_be_deleted_or_written(victims: Victims, attack: str) -> None:
    solution = f"import os\nROOT = {str(victims.root)!r}\n{attack}\n{GOOD}"
    result = run_tests(solution, TESTS, FAST, "bubblewrap")
    assert victims.intact()
    assert_attack_failed(result, "bubblewrap")


@pytest.mark.parametrize("attack", in_inner_loop({"plain-remove": "plain-remove", "chmod": "chmod"}, "plain-remove"))
def test_the_process_fallback_still_refuses_plain_writes_outside(victims: Victims, attack: str) -> None:
    solution = f"import os\nROOT = {str(victims.root)!r}\n{FD_ATTACKS[attack]}\n{GOOD}"
    result = run_tests(solution, TESTS, FAST, "process")
    assert "outside the sandbox" in result.reason
    assert victims.intact()
    assert_attack_failed(result, "process")


@needs_bwrap
@pytest.mark.parametrize("kind", in_inner_loop({"udp": "udp", "tcp": "tcp"}, "tcp"))
def test_nothing_reaches_a_local_listener(kind: str) -> None:
    udp = kind == "udp"
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.5)
    if not udp:
        listener.listen()
    port = listener.getsockname()[1]
    send = (f"s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'exfiltrated', ('127.0.0.1', {port}))"
            if udp else f"socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'exfiltrated')")
    try:
        result = run_tests(f"import socket\n{send}\n{GOOD}", TESTS, FAST, "bubblewrap")
        with pytest.raises(TimeoutError):
            listener.recv(64) if udp else listener.accept()
    finally:
        listener.close()
    assert_attack_failed(result, "bubblewrap")


SIGNALS = {
    "kill-victim": "os.kill(VICTIM, signal.SIGKILL)",
    "pidfd-victim": "signal.pidfd_send_signal(os.pidfd_open(VICTIM), signal.SIGKILL)",
    "pidfd-evaluator": "signal.pidfd_send_signal(os.pidfd_open(EVALUATOR), signal.SIGKILL)",
    "kill-ppid": "os.kill(os.getppid(), signal.SIGKILL)",
    "kill-all": "os.kill(-1, signal.SIGKILL)",
}


@needs_bwrap
@pytest.mark.parametrize("attack", in_inner_loop(SIGNALS, "pidfd-evaluator", "kill-ppid"))
def test_the_evaluator_and_other_processes_cannot_be_signalled(victim_process: subprocess.Popen, attack: str) -> None:
    solution = f"import os, signal\nVICTIM, EVALUATOR = {victim_process.pid}, {os.getpid()}\n{attack}\n{GOOD}"
    result = run_tests(solution, TESTS, FAST, "bubblewrap")
    assert victim_process.poll() is None
    assert_attack_failed(result, "bubblewrap")


FORGERIES = {
    "wrong-answer": "def square(x):\n    return 0\n",
    "exit-0-early": "import os\ndef square(x):\n    os._exit(0)\n",
    "sys-exit": "import sys\ndef square(x):\n    sys.exit(0)\n",
    "exit-before-tests": "import os\nprint('PASSED')\nos._exit(0)\n",
    "excepthook": "import os, sys\nsys.excepthook = lambda *a: (print('PASSED'), os._exit(0))\n"
                  "def square(x):\n    raise ValueError\n",
    "frames-and-gc": "import gc, sys, os\n"
                     "def square(x):\n"
                     "    f = sys._getframe()\n"
                     "    while f:\n"
                     "        for k, v in list(f.f_locals.items()):\n"
                     "            if isinstance(v, str) and len(v) < 200: print(k, v)\n"
                     "        f = f.f_back\n"
                     "    for o in gc.get_objects():\n"
                     "        if isinstance(o, dict) and 'send' in o: o['send']({'ok': 'forged'})\n"
                     "    return 0\n",
    "write-every-fd": "import os\n"
                      "for fd in range(64):\n"
                      "    try: os.write(fd, b'\\n{\"ready\": {}}\\n{\"ok\": 9}\\nPASSED\\n')\n"
                      "    except OSError: pass\n"
                      "def square(x):\n    return 0\n",
    "always-equal": "class Anything:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
                    "def square(x):\n    return Anything()\n",
    "int-subclass": "class Int(int):\n    def __eq__(self, other): return True\n    __hash__ = int.__hash__\n"
                    "def square(x):\n    return Int(0)\n",
    "list-of-anything": "class Anything:\n    def __eq__(self, other): return True\n"
                        "def square(x):\n    return [Anything()]\n",
    "shadow-builtin": "def square(x):\n    return 0\ndef abs(x):\n    return 0\n",
    "shadow-check": "def square(x):\n    return 0\ndef check(candidate):\n    pass\n",
}
# ``abs`` must be the builtin and ``check`` the tests' own function, whatever the solution defines.
FORGERY_TESTS = TESTS + ("assert abs(square(3) - 9) < 1e-9\ndef check(candidate):\n    assert candidate(4) == 16\n"
                         "check(__solution__.square)\n")


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("forgery", in_inner_loop(FORGERIES, "exit-before-tests", "frames-and-gc", "write-every-fd",
                                                  "always-equal"))
def test_a_wrong_solution_cannot_forge_a_pass(isolation: str, forgery: str) -> None:
    result = run_tests(forgery, FORGERY_TESTS, FAST, isolation)
    assert_attack_failed(result, isolation)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_forgeries_tests_pass_an_honest_solution(isolation: str) -> None:
    """What the forgeries fail is the tests, not a run that fails everything."""
    assert run_tests(GOOD, FORGERY_TESTS, FAST, isolation).passed


# -- the OS layer alone (no audit hook): what bubblewrap itself guarantees ---------------------------
@needs_bwrap
def test_bubblewrap_alone_hides_secrets_files_network_and_processes(
    victims: Victims, victim_process: subprocess.Popen, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIMS_SANDBOX_TEST_SECRET", SECRET)
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.5)
    attack = f"""
import os, signal, socket
def attempt(name, action):
    try:
        action()
        print(name, "SUCCEEDED")
    except OSError as e:
        print(name, "refused", type(e).__name__)
attempt("environ", lambda: print(open("/proc/{os.getpid()}/environ").read()))
attempt("listdir", lambda: print(os.listdir({str(victims.root)!r})))
attempt("unlink", lambda: os.unlink("victim.txt", dir_fd=os.open({str(victims.root)!r}, os.O_RDONLY)))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {listener.getsockname()[1]})))
attempt("pidfd", lambda: os.pidfd_open({victim_process.pid}))
attempt("kill-victim", lambda: os.kill({victim_process.pid}, signal.SIGKILL))
attempt("kill-all", lambda: os.kill(-1, 0))
attempt("write-root", lambda: open("/usr/trims_probe", "w"))
attempt("write-here", lambda: open("scratch", "w").write("ok"))
print("uid", os.getuid(), "env", sorted(os.environ))
"""
    out = subprocess.run(bubblewrap_command(FAST) + [sys.executable, "-I", "-c", attack],
                         capture_output=True, text=True, timeout=30)
    with pytest.raises(TimeoutError):
        listener.recv(64)
    listener.close()
    lines = out.stdout.splitlines()
    # The datagram leaves the socket but only onto the sandbox's own loopback: the listener got nothing.
    succeeded = [line for line in lines if "SUCCEEDED" in line]
    assert succeeded == ["udp SUCCEEDED", "write-here SUCCEEDED"], out.stdout + out.stderr
    assert SECRET not in out.stdout and "TRIMS_SANDBOX_TEST_SECRET" not in out.stdout
    assert f"uid 65534 env {sorted(CHILD_ENV)}" in lines
    assert victims.intact() and victim_process.poll() is None


# -- choosing the isolation -----------------------------------------------------------------------
def test_without_bubblewrap_auto_warns_once_and_records_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = f"bwrap is not installed (test {time.monotonic_ns()})"
    monkeypatch.setattr(sandbox, "bubblewrap_problem", lambda: problem)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = run_tests(GOOD, TESTS, FAST)
        second = run_tests(GOOD, TESTS, FAST)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1
    assert problem in messages[0] and "network, pid, mount and user namespaces" in messages[0]
    assert "solutions that import ctypes or subprocess (numpy, scipy, pandas, sympy, asyncio) fail" in messages[0]
    assert (first.isolation, second.isolation) == ("process", "process") and first.passed
    with pytest.raises(SandboxUnavailable, match="bwrap is not installed"):
        run_tests(GOOD, TESTS, FAST, "bubblewrap")


def test_unknown_isolation_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="isolation must be 'auto', 'bubblewrap' or 'process', not 'docker'"):
        run_tests(GOOD, TESTS, FAST, "docker")  # type: ignore[arg-type]
