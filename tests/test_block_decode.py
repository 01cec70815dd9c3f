"""The LLaDA 2.x block decoder against dLLM's ``LLaDA2Sampler`` decision rule, run on the original model's reference."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from original_reference import load_reference

from trims_hf import load_student
from trims_hf.generation import DecodeHook, DecodingConfig, StepRecord, generate

BLOCK, GEN = 8, 16


class _Commits(DecodeHook):
    def __init__(self) -> None:
        self.steps: list[list[tuple[int, int]]] = []

    def on_step(self, record: StepRecord) -> None:
        positions, tokens, _ = record.commits(0)
        self.steps.append(list(zip(positions.tolist(), tokens.tolist())))


def llada2_sampler(model, prompt: list[int], mask_id: int, threshold: float, steps_per_block: int):
    """dLLM ``dllm/pipelines/llada2/sampler.py`` ``LLaDA2Sampler.sample`` (ca176752) for one prompt, greedy, no EOS stop:
    blocks counted from position 0, the canvas to the end of the block holding the last generated position, a
    block-causal mask, one forward per step over the canvas up to the current block, and per step the positions whose
    confidence is above ``threshold`` if they reach the even schedule's quota, else the quota's most confident.
    Returns the canvas cut to prompt + GEN, and each step's commits (response position, token) within the response."""
    length = len(prompt)
    blocks = (length + GEN + BLOCK - 1) // BLOCK
    total = blocks * BLOCK
    ids = torch.arange(total) // BLOCK
    allowed = (ids[None, :] <= ids[:, None])[None, None]
    schedule = torch.full((steps_per_block,), BLOCK // steps_per_block)
    schedule[: BLOCK % steps_per_block] += 1
    x = torch.full((1, total), mask_id)
    x[0, :length] = torch.tensor(prompt)
    trace = []
    for block in range(length // BLOCK, blocks):
        end = (block + 1) * BLOCK
        for step in range(steps_per_block):
            active = x[0, end - BLOCK:end] == mask_id
            if not active.any():
                break
            with torch.no_grad():
                logits = model(x[:, :end], allowed[:, :, :end, :end], torch.arange(end)[None])[0, -BLOCK:]
            probs = logits.float().softmax(-1)
            tokens = probs.argmax(-1)
            confidence = torch.where(active, probs.gather(-1, tokens[:, None])[:, 0], -torch.inf)
            quota = int(schedule[step])
            chosen = confidence > threshold
            if int(chosen.sum()) < quota:
                chosen = torch.zeros_like(active)
                chosen[torch.topk(confidence, k=min(quota, int(active.sum()))).indices] = True
            x[0, end - BLOCK:end][chosen] = tokens[chosen]
            positions = (torch.nonzero(chosen)[:, 0] + end - BLOCK - length).tolist()
            trace.append([(p, int(x[0, length + p])) for p in positions if p < GEN])
    return x[0, : length + GEN].tolist(), trace


@pytest.fixture(scope="module")
def models(original_checkpoint):
    folder = original_checkpoint("llada2")
    return load_student(str(folder)).eval(), load_reference(str(folder), "llada2")


PROMPTS = ([5, 17, 3, 99, 42, 8, 61, 12, 7, 150, 33], [9, 1, 77, 200, 4, 66])  # 11 and 6 tokens: partial blocks


def config(threshold: float, steps_per_block: int, early_stop: bool = False) -> DecodingConfig:
    return DecodingConfig(strategy="threshold_quota", threshold=threshold, gen_length=GEN, block_length=BLOCK,
                          steps=steps_per_block * GEN // BLOCK, early_stop=early_stop)


@pytest.mark.parametrize(("threshold", "steps_per_block"), [(0.95, 8), (0.1, 8), (0.05, 4), (0.95, 3)])
@pytest.mark.parametrize("prompt", PROMPTS, ids=("prompt11", "prompt6"))
def test_commits_steps_and_tokens_equal_the_dllm_sampler(models, prompt, threshold, steps_per_block):
    ours, reference = models
    mask_id = ours.config.mask_token_id
    expected, trace = llada2_sampler(reference, prompt, mask_id, threshold, steps_per_block)
    hook = _Commits()
    output = generate(ours, torch.tensor([prompt]), config=config(threshold, steps_per_block), hooks=[hook])
    assert output.sequences[0].tolist() == expected
    assert hook.steps == trace
    assert output.nfe == len(trace) == int(output.sample_nfe[0])
    assert mask_id not in expected


def test_left_padded_batch_decodes_each_prompt_as_alone(models):
    ours, reference = models
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    output = generate(ours, ids, mask, config=config(0.1, 8))
    for row, prompt in enumerate(PROMPTS):
        expected, trace = llada2_sampler(reference, prompt, ours.config.mask_token_id, 0.1, 8)
        assert output.responses[row].tolist() == expected[len(prompt):]
        assert int(output.sample_nfe[row]) == len(trace)


def test_early_stop_ends_after_the_block_holding_a_stop_as_the_original_generate(models):
    ours, _ = models
    plain = generate(ours, torch.tensor([PROMPTS[0]]), config=config(0.1, 8))
    response = plain.responses[0].tolist()
    stop = response[2]  # a token of the first decoded block, used as the stop id
    stopped = generate(ours, torch.tensor([PROMPTS[0]]),
                       config=DecodingConfig(**{**config(0.1, 8, early_stop=True).__dict__, "stop_token_ids": [stop],
                                                "eos_token_id": 0}))
    first = response.index(stop)
    assert stopped.responses[0].tolist()[: first + 1] == response[: first + 1]
    assert set(stopped.responses[0].tolist()[first + 1:]) <= {0}
    assert stopped.nfe < plain.nfe  # the blocks after the stop cost no forward


@pytest.mark.parametrize(("threshold", "steps_per_block"), [(0.1, 8), (0.05, 4)])
def test_the_prefix_cache_is_exact_and_recomputes_only_from_the_current_blocks(models, threshold, steps_per_block):
    ours, _ = models
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    lengths: list[int] = []
    handle = ours.register_forward_pre_hook(lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]),
                                            with_kwargs=True)
    try:
        plain = generate(ours, ids, mask, config=config(threshold, steps_per_block))
        full = list(lengths)
        cached = generate(ours, ids, mask, config=replace(config(threshold, steps_per_block), cache="prefix"))
    finally:
        handle.remove()
    assert cached.responses.tolist() == plain.responses.tolist()
    assert cached.sample_nfe.tolist() == plain.sample_nfe.tolist() and cached.nfe == plain.nfe
    cached_lengths = lengths[len(full):]
    assert len(cached_lengths) == len(full) and sum(cached_lengths) < sum(full)
    assert all(short <= long for short, long in zip(cached_lengths, full))


class _Blocks(DecodeHook):
    def __init__(self) -> None:
        self.steps: Counter[int] = Counter()

    def on_step(self, record: StepRecord) -> None:
        self.steps[record.block] += 1


def test_the_graph_step_makes_four_forwards_a_block_then_replays(models, monkeypatch):
    """A prompt that ends inside a block (11 tokens, blocks of 8, 16 generated) decodes 3 blocks, from the one holding
    its end to the one holding the last generated position: one more than gen_length / block_length. With the prefix
    cache a block makes one forward per step, none more (its first call writes the keys its later calls read), and
    hands the graphs made for it two call shapes: its first call's, once, and the one all its cached steps share. The
    graph step (:class:`CapturedCalls`: a shape's first call eager, its second a warm-up and a capture, later ones
    replays) so makes 4 forwards a block of 3 steps or more, which the CUDA run counts (test_cuda_correctness.py);
    here a recorder stands in for the graphs, since the CPU has none."""
    import trims_hf.generation.block_causal as block_causal
    import trims_hf.generation.decoding as decoding

    shapes: list[Counter] = []

    class Recorded:
        def __init__(self) -> None:
            self.uses: Counter = Counter()
            shapes.append(self.uses)

        def __call__(self, key, inputs, run):
            self.uses[key] += 1
            return run(inputs)

    monkeypatch.setattr(block_causal, "CapturedCalls", Recorded)
    monkeypatch.setattr(decoding, "resolve_step", lambda *args: "graph")
    ours, _ = models
    forwards, blocks = [], _Blocks()
    handle = ours.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        output = generate(ours, torch.tensor([PROMPTS[0]]), config=replace(config(0.95, 8), cache="prefix"),
                          hooks=[blocks])
    finally:
        handle.remove()
    length = len(PROMPTS[0])
    assert len(blocks.steps) == len(shapes) == -(-(length + GEN) // BLOCK) - length // BLOCK == GEN // BLOCK + 1
    assert len(forwards) == output.nfe == sum(blocks.steps.values())
    assert [sorted(uses.values()) for uses in shapes] == [sorted([1, steps - 1]) for steps in blocks.steps.values()]
    captured = sum(1 if uses == 1 else 3 for shape in shapes for uses in shape.values())
    assert min(blocks.steps.values()) >= 3 and captured == 4 * len(shapes) < output.nfe


def test_a_suffix_cache_is_refused_naming_the_setting(models):
    with pytest.raises(ValueError, match="cache='dual'"):
        generate(models[0], torch.tensor([PROMPTS[0]]), config=DecodingConfig(gen_length=GEN, block_length=BLOCK,
                                                                                cache="dual"))


def test_threshold_quota_at_a_temperature_scores_the_tempered_probability(models, monkeypatch):
    """The block-causal decoder asks the proposals for LLaDA 2.x's tempered confidence (the rule itself:
    test_generation.py's test of the same name)."""
    import trims_hf.generation.block_causal as block_causal
    from trims_hf.generation.steps import propose

    asked = []

    def spy(*args):
        asked.append(args[5:])
        return propose(*args)

    monkeypatch.setattr(block_causal, "propose", spy)
    ours, _ = models
    generate(ours, torch.tensor([PROMPTS[1]]), config=replace(config(0.95, 8), temperature=0.7, seed=0))
    assert asked and all(extra == (True,) for extra in asked)
