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


def _config(run: dict, settings: dict) -> DecodingConfig:
    common = {"gen_length": settings["gen_length"], "block_length": settings["block_length"], "early_stop": False}
    if run["decoder"] == "fixed_steps":
        return DecodingConfig(strategy="fixed_steps", steps=run["steps_arg"], **common)
    return DecodingConfig(strategy="threshold", threshold=run["threshold"], **common)


@pytest.mark.parametrize(
    "run", TRACES["runs"], ids=lambda r: f"prompt{r['prompt_index']}-{r['decoder']}-{r['threshold']}"
)
def test_trace_parity(llada_tiny, run):
    """Per-step commits (positions, tokens), NFE and the final sequence equal the reference run."""
    hook = _Commits()
    output = generate(
        llada_tiny, torch.tensor([run["prompt_ids"]]), config=_config(run, TRACES["settings"]), hooks=[hook]
    )
    expected = [
        (step["block"], [(c["pos"] - run["prompt_length"], c["token"]) for c in step["committed"]])
        for step in run["per_step"]
    ]
    assert hook.steps == expected
    assert output.nfe == run["nfe"] == int(output.sample_nfe[0])
    assert output.sequences[0].tolist() == run["final_sequence"]


@pytest.mark.parametrize("threshold", [0.9, 0.3, 0.0, None])
def test_batched_left_padded_parity(llada_tiny, threshold):
    """Both prompts in one left-padded batch reproduce their own reference runs (sequence and NFE)."""
    runs = [r for r in TRACES["runs"] if r["threshold"] == threshold]
    width = max(r["prompt_length"] for r in runs)
    ids = torch.tensor([[0] * (width - r["prompt_length"]) + r["prompt_ids"] for r in runs])
    mask = torch.tensor([[0] * (width - r["prompt_length"]) + [1] * r["prompt_length"] for r in runs])
    output = generate(llada_tiny, ids, mask, config=_config(runs[0], TRACES["settings"]))
    assert output.responses.tolist() == [r["generated_ids"] for r in runs]
    assert output.sample_nfe.tolist() == [r["nfe"] for r in runs]
    assert output.nfe >= max(r["nfe"] for r in runs)
