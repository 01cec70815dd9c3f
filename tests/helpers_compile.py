"""Compiling without generated code, for the tests whose claim is what trims_hf decides rather than inductor's
kernels (the ``compile_without_codegen`` fixture, and through ``no_codegen/`` the subprocesses such tests start)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

NO_CODEGEN_BACKEND = "aot_eager_decomp_partition"
"""dynamo's graphs, AOTAutograd's decompositions and inductor's partition of forward and backward, but no generated
C++, which the CPU compiles one kernel at a time (about 2 s each: most of a compiled test's minutes)."""

NO_CODEGEN_PATH = Path(__file__).resolve().parent / "no_codegen"
"""Put first on a subprocess's PYTHONPATH: its ``sitecustomize`` makes every process of that run compile so."""


def without_codegen(compile_module: Callable[..., Any]) -> Callable[..., Any]:
    """``nn.Module.compile`` lowering with :data:`NO_CODEGEN_BACKEND` unless a backend is named."""

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("backend", NO_CODEGEN_BACKEND)
        return compile_module(self, *args, **kwargs)

    return compile
