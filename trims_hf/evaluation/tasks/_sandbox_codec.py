"""The sandbox children's wire format of values (JSON with tagged containers) and their start-up.

Not imported: :func:`trims_hf.evaluation.tasks.sandbox._child_script` puts this text before each child's own file and runs
the whole as ``python -I -B -c``, so the child needs no file of ours inside the sandbox.
"""

import builtins
import decimal
import fractions
import json
import os  # noqa: F401 (the children's)
import resource
import sys


def encode(x, other):
    """Plain values by content; an instance of a subclass (Counter, namedtuple, an int with an odd
    ``__eq__``) as its base type, read through the base type's own methods; builtin types by name."""
    if x is None or type(x) is bool:
        return x
    for base, plain in ((int, int.__int__), (float, float.__float__), (str, str.__str__)):
        if isinstance(x, base):
            return plain(x)
    if isinstance(x, list):
        return [encode(i, other) for i in list.__iter__(x)]
    for base, tag in ((tuple, "t"), (set, "s"), (frozenset, "f")):
        if isinstance(x, base):
            return {tag: [encode(i, other) for i in base.__iter__(x)]}
    if isinstance(x, dict):
        return {"d": [[encode(k, other), encode(v, other)] for k, v in dict.items(x)]}
    if isinstance(x, bytes):
        return {"b": bytes.hex(x)}
    if isinstance(x, complex):
        return {"c": [complex.real.__get__(x), complex.imag.__get__(x)]}
    if isinstance(x, range):
        return {"r": [int.__int__(range.start.__get__(x)), int.__int__(range.stop.__get__(x)),
                      int.__int__(range.step.__get__(x))]}
    if isinstance(x, fractions.Fraction):  # exact numbers a test compares with numbers: by value, as the reference
        return {"q": [int.__int__(x._numerator), int.__int__(x._denominator)]}
    if isinstance(x, decimal.Decimal):
        return {"m": decimal.Decimal.__str__(x)}
    if isinstance(x, type) and getattr(builtins, x.__name__, None) is x:
        return {"y": x.__name__}
    return other(x)


def decode(x, handle):
    if isinstance(x, list):
        return [decode(i, handle) for i in x]
    if not isinstance(x, dict):
        return x
    (tag, value), = x.items()
    if tag == "h":
        return handle(value)
    if tag == "b":
        return bytes.fromhex(value)
    if tag == "c":
        return complex(*value)
    if tag == "r":
        return range(*value)
    if tag == "q":
        return fractions.Fraction(*value)
    if tag == "m":
        return decimal.Decimal(value)
    if tag == "y":
        kind = getattr(builtins, value)
        if not isinstance(kind, type):
            raise TypeError(f"not a builtin type: {value!r}")
        return kind
    if tag == "d":
        return {decode(k, handle): decode(v, handle) for k, v in value}
    return {"t": tuple, "s": set, "f": frozenset}[tag](decode(i, handle) for i in value)


def setup():
    """Limits from argv[1]; returns the two RPC fds from argv[2:4]."""
    for name, value in json.loads(sys.argv[1]).items():
        resource.setrlimit(getattr(resource, name), (value, value))
    sys.set_int_max_str_digits(0)
    return int(sys.argv[2]), int(sys.argv[3])
