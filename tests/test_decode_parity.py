"""Exact parity with the reference Fast-dLLM / LLaDA decoder traces (fixtures/decode_traces.json)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FIXTURES

from trims_hf import load_student
from trims_hf.generation import DecodeHook, DecodingConfig, StepRecord, generate

TRACES = json.loads((FIXTURES / "decode_traces.json").read_text())


class _Commits(DecodeHook):
    def __init__(self) -> None:
        self.steps: list[tuple[int, list[tuple[int, int]]]] = []

    def on_step(self, record: StepRecord) -> None:
        positions, tokens, _ = record.commits(0)
        self.steps.append((record.block, list(zip(positions.tolist(), tokens.tolist()))))


@pytest.fixture(scope="module")
def llada_tiny():
    return load_student(str(FIXTURES / "llada_tiny"))


@pytest.fixture(scope="module")
def compiled_llada_tiny():
    """A student of its own: ``compile_blocks`` compiles in place, and the plain tests must run the eager blocks."""
    return load_student(str(FIXTURES / "llada_tiny"))


COMPILED = [False, pytest.param(True, marks=pytest.mark.slow)]
"""Each parity test runs with the decoder blocks as they are and compiled (``DecodingConfig.compile_blocks``, which
compiles the first time and takes tens of seconds on a CPU)."""


@pytest.fixture(params=COMPILED, ids=["eager_blocks", "compiled_blocks"])
def student_and_compiled(request, llada_tiny, compiled_llada_tiny):
    return (compiled_llada_tiny if request.param else llada_tiny), request.param


def _config(run: dict, settings: dict, compiled: bool = False) -> DecodingConfig:
    common = {"gen_length": settings["gen_length"], "block_length": settings["block_length"], "early_stop": False,
              "compile_blocks": compiled}
    if run["decoder"] == "fixed_steps":
        return DecodingConfig(strategy="fixed_steps", steps=run["steps_arg"], **common)
    return DecodingConfig(strategy="threshold", threshold=run["threshold"], **common)


@pytest.mark.parametrize(
    "run", TRACES["runs"], ids=lambda r: f"prompt{r['prompt_index']}-{r['decoder']}-{r['threshold']}"
)
def test_trace_parity(student_and_compiled, run):
    """Per-step commits (positions, tokens), NFE and the final sequence equal the reference run."""
    model, compiled = student_and_compiled
    hook = _Commits()
    output = generate(
        model, torch.tensor([run["prompt_ids"]]), config=_config(run, TRACES["settings"], compiled), hooks=[hook]
    )
    expected = [
        (step["block"], [(c["pos"] - run["prompt_length"], c["token"]) for c in step["committed"]])
        for step in run["per_step"]
    ]
    assert hook.steps == expected
    assert output.nfe == run["nfe"] == int(output.sample_nfe[0])
    assert output.sequences[0].tolist() == run["final_sequence"]


@pytest.mark.parametrize("threshold", [0.9, 0.3, 0.0, None])
def test_batched_left_padded_parity(student_and_compiled, threshold):
    """Both prompts in one left-padded batch reproduce their own reference runs (sequence and NFE)."""
    model, compiled = student_and_compiled
    runs = [r for r in TRACES["runs"] if r["threshold"] == threshold]
    width = max(r["prompt_length"] for r in runs)
    ids = torch.tensor([[0] * (width - r["prompt_length"]) + r["prompt_ids"] for r in runs])
    mask = torch.tensor([[0] * (width - r["prompt_length"]) + [1] * r["prompt_length"] for r in runs])
    output = generate(model, ids, mask, config=_config(runs[0], TRACES["settings"], compiled))
    assert output.responses.tolist() == [r["generated_ids"] for r in runs]
    assert output.sample_nfe.tolist() == [r["nfe"] for r in runs]
    assert output.nfe >= max(r["nfe"] for r in runs)
