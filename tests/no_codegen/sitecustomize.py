"""Run at the start of every Python process whose PYTHONPATH starts with this folder (``helpers_compile.NO_CODEGEN_PATH``):
``nn.Module.compile`` lowers without generated code there, as under the ``compile_without_codegen`` fixture."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for this import only
try:
    from helpers_compile import without_codegen
finally:
    del sys.path[0]

torch.nn.Module.compile = without_codegen(torch.nn.Module.compile)
