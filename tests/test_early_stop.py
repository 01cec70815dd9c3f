"""Early stop saves forwards but never changes a token up to and including the first stop token.

The oracle is decoding with early stop off: the reference Fast-dLLM / LLaDA traces on the fixture model, and
our own early-stop-off runs on random tiny students (batched and unbatched, every cache mode).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import tiny_student
from test_decode_parity import TRACES, _config
from test_generation import PROMPTS, _left_pad

from trims_hf.generation import DecodeHook, DecodingConfig, StepRecord, generate, tokens_before_stop


class _ForwardsPerBlock(DecodeHook):
    """Counts, per sample and block, the forwards charged to the sample."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[int, int]] = Counter()

    def on_step(self, record: StepRecord) -> None:
        for row in record.charged.nonzero().squeeze(-1).tolist():
            self.counts[row, record.block] += 1

    def up_to(self, row: int, block: int) -> int:
        return sum(n for (r, b), n in self.counts.items() if r == row and b <= block)


def _assert_prefix_kept(on, off, off_forwards: _ForwardsPerBlock, stops: tuple[int, ...], block_length: int, eos: int):
    """Tokens up to the first stop equal the early-stop-off run, EOS after it, and the forwards charged are
    exactly the off run's forwards up to the block holding the stop."""
    first = tokens_before_stop(off.responses, stops).tolist()
    for row, stop_at in enumerate(first):
        kept = min(stop_at + 1, off.responses.shape[1])
        assert on.responses[row, :kept].tolist() == off.responses[row, :kept].tolist()
        assert (on.responses[row, kept:] == eos).all()
        last_block = min(stop_at, off.responses.shape[1] - 1) // block_length
        assert int(on.sample_nfe[row]) == off_forwards.up_to(row, last_block)


@pytest.fixture(scope="module")
def llada_tiny():
    from test_decode_parity import FIXTURES

    from trims_hf import load_student

    return load_student(str(FIXTURES / "llada_tiny"))


@pytest.mark.parametrize("run", TRACES["runs"], ids=lambda r: f"prompt{r['prompt_index']}-{r['decoder']}-{r['threshold']}")
def test_early_stop_keeps_reference_tokens_on_the_fixture(llada_tiny, run):
    """Every token of the reference run (no early stop) serves as the stop token in turn; with early stop on
    (the default) the response up to that stop is the reference's and the forwards are the reference's
    steps up to the stop's block."""
    settings = TRACES["settings"]
    reference = run["generated_ids"]
    eos = llada_tiny.config.eos_token_id
    base = _config(run, settings)
    for stop in dict.fromkeys(reference):
        config = DecodingConfig(**{**base.__dict__, "early_stop": True, "stop_token_ids": (stop,)})
        output = generate(llada_tiny, torch.tensor([run["prompt_ids"]]), config=config)
        first = reference.index(stop)
        assert output.responses[0, : first + 1].tolist() == reference[: first + 1], f"stop token {stop}"
        assert (output.responses[0, first + 1 :] == eos).all()
        stop_block = first // settings["block_length"]
        assert output.nfe == sum(step["block"] <= stop_block for step in run["per_step"]), f"stop token {stop}"


@pytest.fixture(scope="module")
def students(tokenizer):
    return {kind: tiny_student(tokenizer, kind, seed=seed, hidden=64) for kind, seed in (("llada", 5), ("dream", 6))}


@pytest.mark.parametrize("kind", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_early_stop_keeps_tokens_on_random_students(students, tokenizer, kind, cache):
    """Stop ids are tokens the early-stop-off run writes mid-block; batched (left-padded) and one prompt at
    a time, early stop keeps every token up to the first stop and saves only later blocks' forwards."""
    model = students[kind]
    block_length, eos = 8, tokenizer.eos_token_id
    off_config = DecodingConfig(gen_length=24, block_length=block_length, threshold=0.3, cache=cache, early_stop=False)
    ids, mask = _left_pad(PROMPTS, tokenizer.pad_token_id)
    off_forwards = _ForwardsPerBlock()
    off = generate(model, ids, mask, off_config, hooks=[off_forwards])
    stops = tuple(dict.fromkeys(off.responses[:, 5].tolist()))
    on_config = DecodingConfig(**{**off_config.__dict__, "early_stop": True, "stop_token_ids": stops, "eos_token_id": eos})
    on = generate(model, ids, mask, on_config)
    _assert_prefix_kept(on, off, off_forwards, stops, block_length, eos)
    assert on.nfe < off.nfe  # the stop sits in block 0 of every row: blocks 1 and 2 cost nothing
    for row, prompt in enumerate(PROMPTS):
        alone_forwards = _ForwardsPerBlock()
        alone_off = generate(model, torch.tensor([prompt]), config=off_config, hooks=[alone_forwards])
        alone_on = generate(model, torch.tensor([prompt]), config=on_config)
        _assert_prefix_kept(alone_on, alone_off, alone_forwards, stops, block_length, eos)
        assert alone_on.responses[0].tolist() == on.responses[row].tolist()
