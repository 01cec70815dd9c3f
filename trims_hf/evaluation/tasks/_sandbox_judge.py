"""The sandbox's judge process (see :mod:`trims_hf.evaluation.tasks.sandbox`).

Not imported: run as ``python -I -B -c`` after the text of ``_sandbox_codec.py`` (which defines ``encode``,
``decode`` and ``setup``); argv: limits (JSON), request fd, reply fd; the entry points (a JSON line), then the tests on stdin.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the codec's names, prepended at run time
    from ._sandbox_codec import builtins, decode, encode, json, os, setup, sys  # noqa: TC004
import importlib
import types

# Standard-library modules whose import does something (opens a browser, prints).
_NOISY_MODULES = frozenset({"antigravity", "this", "__hello__", "__phello__"})


class SolutionError(Exception):
    """The solution raised an exception that is not a builtin one, or its process went away."""


class Remote:
    """A name or object of the solution: calling it, or iterating over it, asks the solution process (a
    ``StopIteration`` it raises crosses back as one, so iteration ends as in the solution)."""

    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle

    def __call__(self, *args, **kwargs):
        return _ask({"call": self.handle, "args": encode(list(args), _reference), "kwargs": encode(kwargs, _reference)})

    def __iter__(self):
        """``iter()`` of the solution's object, run by the solution: a generator or map the solution returned is read
        item by item, as the reference graders (which hold the object itself) read it, so a test may stop early."""
        return _ask({"iter": self.handle})

    def __next__(self):
        return _ask({"next": self.handle})

    def __repr__(self):
        return f"<solution object #{self.handle}>"


def _reference(obj):
    if isinstance(obj, Remote):
        return {"h": obj.handle}
    raise TypeError(f"a test passed a {type(obj).__name__} to the solution; only plain values can cross")


def _ask(request):
    _requests.write(json.dumps(request).encode() + b"\n")
    _requests.flush()
    return decode(_receive()["ok"], Remote)


def _receive():
    line = _replies.readline()
    if not line:
        raise SolutionError("the solution process ended before answering (it exited, was killed or hit a limit)")
    message = json.loads(line)
    if "raise" in message:
        name, text = message["raise"]
        kind = getattr(builtins, str(name), None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            kind, text = SolutionError, f"{name}: {text}"
        raise kind(text)
    return message


if __name__ == "__main__":
    request_fd, reply_fd = setup()
    _requests, _replies = os.fdopen(request_fd, "wb"), os.fdopen(reply_fd, "rb")
    _entry_points = set(json.loads(sys.stdin.readline()))  # may shadow builtins' names: they are under test
    _tests = sys.stdin.read()
    sys.stdin.close()
    _names = {}
    for _key, _value in _receive()["ready"].items():
        _key = str(_key)
        if _key.startswith("__") or (hasattr(builtins, _key) and _key not in _entry_points):
            continue
        if not (isinstance(_value, dict) and set(_value) == {"m"}):
            _names[_key] = decode(_value, Remote)
        elif _value["m"] == _key and _key in sys.stdlib_module_names and _key not in _NOISY_MODULES:
            _names[_key] = importlib.import_module(_key)  # the solution's `import math`: the judge's own copy
    _namespace = {"__name__": "__main__", "__builtins__": builtins, "__solution__": types.SimpleNamespace(**_names)}
    _namespace.update(_names)
    exec(compile(_tests, "tests.py", "exec"), _namespace)  # noqa: S102 (the task's tests)
