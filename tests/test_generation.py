"""Decoder semantics on scripted students, KV-cache plumbing on real tiny models, hooks and plots."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_student
from torch import nn
from transformers import PreTrainedConfig

from trims_hf import prepare_student, student_logits, student_spec
from trims_hf.generation import (
    ConfidenceFactor,
    DecodeHook,
    DecodingConfig,
    EntropyThreshold,
    FixedSteps,
    StepRecord,
    StudentForward,
    TokensPerStepRecorder,
    TrajectoryRecorder,
    generate,
    generate_text,
    teacher_nll_per_step,
)
from trims_hf.generation.plots import plot_decode_order, plot_teacher_nll

VOCAB, EOS, EOT, MASK = 16, 14, 13, 15
Script = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class ScriptedStudent(nn.Module):
    """A fake student: ``script(input_ids, position_ids) -> (tokens, confidences)`` per raw output position.

    Logits give the scripted token exactly the scripted softmax probability, the rest spread evenly.
    Window inputs (KV-cached calls) are handled because the script sees absolute positions.
    """

    def __init__(self, script: Script, kind: str = "llada") -> None:
        super().__init__()
        self.config = PreTrainedConfig(vocab_size=VOCAB, eos_token_id=EOS, num_hidden_layers=1)
        self.script = script
        self.inputs: list[torch.Tensor] = []
        prepare_student(self, kind, MASK)

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, **kwargs):
        self.inputs.append(input_ids.clone())
        tokens, confidence = self.script(input_ids, position_ids)
        confidence = confidence.double()[..., None]
        logits = torch.log((1 - confidence) / (VOCAB - 1)).expand(*tokens.shape, VOCAB).clone()
        logits.scatter_(-1, tokens[..., None], torch.log(confidence))
        return SimpleNamespace(logits=logits.float()[:, logits_to_keep])


def by_position(tokens: list[int], confidences: list[float], prompt_length: int) -> Script:
    """Script whose output at response position j is ``tokens[j]`` with ``confidences[j]`` (prompt: filler)."""
    table_tokens = torch.tensor([0] * prompt_length + tokens)
    table_conf = torch.tensor([0.5] * prompt_length + confidences, dtype=torch.float64)
    return lambda ids, positions: (table_tokens[positions], table_conf[positions])


class Commits(DecodeHook):
    """Collects (block, committed response positions, filled positions) per step for sample 0."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, list[int], list[int]]] = []

    def on_step(self, record: StepRecord) -> None:
        filled = record.filled[0].nonzero().squeeze(-1).tolist()
        self.steps.append((record.block, record.commits(0)[0].tolist(), filled))


PROMPT = torch.tensor([[1, 2]])


def run(script: Script, config: DecodingConfig, kind: str = "llada", prompt: torch.Tensor = PROMPT):
    model, hook = ScriptedStudent(script, kind), Commits()
    return generate(model, prompt, config=config, hooks=[hook]), hook, model


# --- strategies and the main loop -------------------------------------------------------------------


def test_threshold_commits_at_least_one_and_block_order():
    confidences = [0.95, 0.5, 0.92, 0.3] + [0.99] * 4  # block 1 is confident but must wait for block 0
    output, hook, _ = run(
        by_position([3, 4, 5, 6, 7, 8, 9, 10], confidences, 2),
        DecodingConfig(gen_length=8, block_length=4, threshold=0.9, early_stop=False),
    )
    assert [(block, positions) for block, positions, _ in hook.steps] == [
        (0, [0, 2]),
        (0, [1]),
        (0, [3]),
        (1, [4, 5, 6, 7]),
    ]
    assert output.nfe == 4 and output.sample_nfe.tolist() == [4]
    assert output.responses.tolist() == [[3, 4, 5, 6, 7, 8, 9, 10]]


def test_fixed_steps_quotas_and_nfe():
    config = DecodingConfig(strategy="fixed_steps", steps=6, gen_length=8, block_length=4, early_stop=False)
    output, hook, _ = run(by_position(list(range(3, 11)), [0.9, 0.8, 0.7, 0.6, 0.6, 0.7, 0.8, 0.9], 2), config)
    # 3 steps per block, 4 masks: quotas 2, 1, 1, most confident first.
    assert [positions for _, positions, _ in hook.steps] == [[0, 1], [2], [3], [6, 7], [5], [4]]
    assert output.nfe == 6


def test_factor_and_entropy_rules_select_directly():
    candidates = torch.tensor([[True, True, True, True, False]])
    confidences = torch.tensor([[0.7, 0.99, 0.8, 0.95, 1.0]], dtype=torch.float64)
    # (n+1)(1-c(n)): 0.02, 0.15, 0.8, 1.5 -> n = 3 for f = 1; the non-candidate (1.0) is never taken.
    assert ConfidenceFactor(1.0).select(confidences, candidates, 0, None).tolist() == [[False, True, True, True, False]]
    assert ConfidenceFactor(0.0).select(confidences, candidates, 0, None).tolist() == [
        [False, True, False, False, False]
    ]
    entropies = torch.tensor([[0.4, 2.0, 0.1, 3.0, 0.0]], dtype=torch.float64)
    assert EntropyThreshold(0.5).select(entropies, candidates, 0, None).tolist() == [[True, False, True, False, False]]
    assert EntropyThreshold(0.05).select(entropies, candidates, 0, None).tolist() == [
        [False, False, True, False, False]
    ]
    # LLaDA quotas: m=5 over 3 steps -> 2, 2, 1.
    initial = torch.tensor([5])
    quotas = [int(FixedSteps(3).select(confidences, candidates, s, initial).sum()) for s in range(3)]
    assert quotas == [2, 2, 1]


def test_entropy_strategy_end_to_end():
    config = DecodingConfig(strategy="entropy", entropy_threshold=0.5, gen_length=4, block_length=4, early_stop=False)
    output, hook, _ = run(by_position([3, 4, 5, 6], [0.999, 0.3, 0.999, 0.3], 2), config)
    assert [positions for _, positions, _ in hook.steps] == [[0, 2], [1], [3]]
    assert output.nfe == 3


def test_mask_token_is_never_proposed():
    def script(ids, positions):
        return torch.full_like(ids, MASK), torch.full(ids.shape, 0.9, dtype=torch.float64)

    output, _, _ = run(script, DecodingConfig(gen_length=4, block_length=4, early_stop=False))
    assert (output.responses != MASK).all()


def test_early_stop_waits_for_the_block_then_fills_eos_and_skips_blocks():
    """EOS is committed first, but positions 0, 2, 3 of its block stay masks (the context they would have
    without early stop) until decoded; then everything after the EOS is filled and blocks 1-2 cost nothing."""
    tokens = [3, EOS, 5, 6] + [7] * 8
    confidences = [0.5, 0.99, 0.5, 0.5] + [0.99] * 8
    config = DecodingConfig(gen_length=12, block_length=4)
    output, hook, model = run(by_position(tokens, confidences, 2), config)
    assert hook.steps == [(0, [1], []), (0, [0], []), (0, [2], []), (0, [3], list(range(2, 12)))]
    assert [int((ids[0, 2:] == MASK).sum()) for ids in model.inputs] == [12, 11, 10, 9]  # no EOS seen early
    assert output.nfe == len(model.inputs) == 4
    assert output.responses.tolist() == [[3] + [EOS] * 11]
    off, _, _ = run(
        by_position(tokens, confidences, 2), DecodingConfig(gen_length=12, block_length=4, early_stop=False)
    )
    assert off.nfe == 6 and off.responses.tolist() == [[3, EOS, 5, 6] + [7] * 8]


def test_stop_token_other_than_eos_fills_with_eos():
    tokens, confidences = [3, EOT, 5, 6], [0.99] * 4
    config = DecodingConfig(gen_length=4, block_length=4, stop_token_ids=(EOS, EOT))
    output, hook, _ = run(by_position(tokens, confidences, 2), config)
    assert output.responses.tolist() == [[3, EOT, EOS, EOS]]
    assert hook.steps == [(0, [0, 1, 2, 3], [2, 3])]


def test_dream_shift_reads_previous_position():
    def script(ids, positions):  # the raw output at absolute position p proposes token p
        return positions % 13, torch.full(ids.shape, 0.99, dtype=torch.float64)

    config = DecodingConfig(gen_length=4, block_length=4, early_stop=False)
    llada, _, _ = run(script, config, kind="llada")
    dream, _, _ = run(script, config, kind="dream")
    assert llada.responses.tolist() == [[2, 3, 4, 5]]
    assert dream.responses.tolist() == [[1, 2, 3, 4]]


@pytest.mark.parametrize("mode, lengths", [("prefix", [10, 8, 8, 10, 4, 4]), ("dual", [10, 4, 4, 10, 4, 4])])
def test_cache_windows_nfe_and_dream_block_head(mode, lengths):
    """Refresh = full forward at block start; cached steps recompute only the mode's window. Dream commits
    each block head at the refresh although the head is the least confident position."""

    def script(ids, positions):  # raw positions 1 and 5 predict the block heads (absolute 2 and 6)
        confidence = torch.where((positions == 1) | (positions == 5), 0.1, 0.5).double()
        return positions % 13, confidence

    config = DecodingConfig(gen_length=8, block_length=4, threshold=0.9, cache=mode, early_stop=False)
    output, hook, model = run(script, config, kind="dream")
    assert [ids.shape[1] for ids in model.inputs] == lengths
    assert [positions for _, positions, _ in hook.steps] == [[0, 1], [2], [3], [4, 5], [6], [7]]
    assert output.nfe == 6 and output.responses.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]


# --- real tiny models: padding, batching, caches ----------------------------------------------------


@pytest.fixture(scope="module")
def llama(tokenizer):
    return tiny_student(tokenizer, "llada", seed=0, hidden=64)


@pytest.fixture(scope="module")
def qwen(tokenizer):
    return tiny_student(tokenizer, "dream", seed=1, hidden=64)


def _left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    return ids, (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()


PROMPTS = [[5, 40, 77, 90, 120, 31, 8], [300, 12], [17, 250, 66, 9]]


@pytest.mark.parametrize("kind", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_windowed_forward_matches_full_forward_with_padding(request, kind, cache):
    model = request.getfixturevalue("llama" if kind == "llada" else "qwen")
    ids, mask = _left_pad(PROMPTS, 1)
    x = torch.cat([ids, torch.randint(3, 300, (3, 16), generator=torch.Generator().manual_seed(0))], dim=1)
    mask = torch.cat([mask, torch.ones(3, 16, dtype=torch.long)], dim=1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    full = student_logits(model, x, mask, position_ids=positions)
    for row in range(3):  # padding changes nothing: each row's logits are those of the unpadded sequence
        pad = int((mask[row] == 0).sum())  # (Dream's aligned position 0 has no predictor: compared from 1)
        alone = student_logits(model, x[row : row + 1, pad:])
        torch.testing.assert_close(full[row : row + 1, pad + 1 :], alone[:, 1:], atol=1e-5, rtol=1e-5)
    forward = StudentForward(model, student_spec(model), cache, mask, positions)
    start = ids.shape[1] + 8
    torch.testing.assert_close(forward(x, start, start + 8, True), full[:, start : start + 8], atol=1e-5, rtol=1e-5)
    cached = forward(x, start, start + 8, False)  # nothing changed, so reuse is exact (row 0 of Dream unused)
    torch.testing.assert_close(cached[:, 1:], full[:, start + 1 : start + 8], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_batched_equals_unbatched_with_left_padding(request, tokenizer, kind, cache):
    model = request.getfixturevalue("llama" if kind == "llada" else "qwen")
    _assert_batched_equals_alone(model, tokenizer, cache)


def _assert_batched_equals_alone(model: nn.Module, tokenizer, cache: str = "none") -> None:
    """Each row of a left-padded batch decodes to the tokens, and is charged the forwards, of its prompt alone."""
    config = DecodingConfig(gen_length=16, block_length=8, threshold=0.2, cache=cache, early_stop=False)
    ids, mask = _left_pad(PROMPTS, tokenizer.pad_token_id)
    batched = generate(model, ids, mask, config)
    for row, prompt in enumerate(PROMPTS):
        alone = generate(model, torch.tensor([prompt]), config=config)
        assert batched.responses[row].tolist() == alone.responses[0].tolist()
        assert int(batched.sample_nfe[row]) == alone.nfe
    assert batched.nfe >= int(batched.sample_nfe.max())


def _masked_lm(tokenizer, family: str) -> nn.Module:
    """A tiny random BERT (absolute positions from 0) or RoBERTa (positions offset by a padding row)."""
    from transformers import BertConfig, BertForMaskedLM, RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(4)
    sizes = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model = (BertForMaskedLM(BertConfig(**sizes)) if family == "bert"
             else RobertaForMaskedLM(RobertaConfig(max_position_embeddings=64, **sizes)))
    return prepare_student(model.eval(), "masked_lm", tokenizer.mask_token_id)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_masked_lm_batched_equals_unbatched_with_left_padding(tokenizer, family):
    """Absolute positions must count real tokens: a left-padded BERT row decodes as the prompt alone."""
    model = _masked_lm(tokenizer, family) if family == "bert" else tiny_student(tokenizer, "masked_lm", seed=4, hidden=64)
    _assert_batched_equals_alone(model, tokenizer)


def test_masked_lm_with_offset_positions_rejects_left_padding(tokenizer):
    model = _masked_lm(tokenizer, "roberta")
    ids, mask = _left_pad(PROMPTS, tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="offsets its positions"):
        generate(model, ids, mask, DecodingConfig(gen_length=8, block_length=8, early_stop=False))
    unpadded = generate(model, ids[:1], mask[:1], DecodingConfig(gen_length=8, block_length=8, early_stop=False))
    assert unpadded.responses.shape == (1, 8)  # a batch without padding needs no position ids


def _blind_llama(tokenizer) -> nn.Module:
    """A real Llama whose attention output is zeroed: each position sees only itself, so KV reuse is exact."""
    model = tiny_student(tokenizer, "llada", seed=2, hidden=64)
    for layer in model.model.layers:
        nn.init.zeros_(layer.self_attn.o_proj.weight)
    return model


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_equals_no_cache_when_context_is_ignored(tokenizer, cache):
    model = _blind_llama(tokenizer)
    ids, mask = _left_pad(PROMPTS, tokenizer.pad_token_id)
    config = DecodingConfig(gen_length=32, block_length=8, threshold=0.3, early_stop=False)
    reference = generate(model, ids, mask, config)
    cached = generate(model, ids, mask, DecodingConfig(**{**config.__dict__, "cache": cache}))
    assert torch.equal(cached.sequences, reference.sequences)
    assert cached.nfe == reference.nfe and torch.equal(cached.sample_nfe, reference.sample_nfe)


def cache_agreement(model: nn.Module, prompts: list[list[int]], config: DecodingConfig) -> dict[str, float]:
    """Fraction of samples identical to the no-cache output, and of identical tokens, per cache mode."""
    reference = [generate(model, torch.tensor([p]), config=config).responses[0] for p in prompts]
    result = {}
    for mode in ("prefix", "dual"):
        cached = [
            generate(model, torch.tensor([p]), config=DecodingConfig(**{**config.__dict__, "cache": mode})).responses[0]
            for p in prompts
        ]
        result[f"{mode}_identical_samples"] = sum(torch.equal(a, b) for a, b in zip(cached, reference)) / len(prompts)
        result[f"{mode}_identical_tokens"] = float(
            torch.cat([a == b for a, b in zip(cached, reference)]).double().mean()
        )
    return result


def test_cache_drift_on_the_fixture():
    """Threshold 0 decides each block at its full forward, so caches must be exact there; at tau 0.9 the
    stale keys/values make outputs drift (the numbers are printed and reported, the bound is a canary)."""
    from test_decode_parity import FIXTURES, TRACES

    from trims_hf import load_student

    model = load_student(str(FIXTURES / "llada_tiny"))
    prompts = [run["prompt_ids"] for run in TRACES["runs"][:: len(TRACES["runs"]) // 2]]
    prompts += torch.randint(0, 250, (6, 9), generator=torch.Generator().manual_seed(3)).tolist()
    exact = cache_agreement(
        model, prompts, DecodingConfig(gen_length=32, block_length=8, threshold=0.0, early_stop=False)
    )
    assert exact == {
        "prefix_identical_samples": 1.0,
        "prefix_identical_tokens": 1.0,
        "dual_identical_samples": 1.0,
        "dual_identical_tokens": 1.0,
    }
    drift = cache_agreement(model, prompts, DecodingConfig(gen_length=32, block_length=8, early_stop=False))
    print("cache agreement with no cache on llada_tiny, tau 0.9:", drift)
    assert drift["prefix_identical_tokens"] > 0.25 and drift["dual_identical_tokens"] > 0.25


# --- sampling ---------------------------------------------------------------------------------------


def test_temperature_sampling_is_seeded(llama):
    config = {"gen_length": 16, "block_length": 8, "temperature": 1.0, "early_stop": False}
    prompt = torch.tensor([PROMPTS[0]])
    first = generate(llama, prompt, config=DecodingConfig(seed=7, **config)).responses
    again = generate(llama, prompt, config=DecodingConfig(seed=7, **config)).responses
    other = generate(llama, prompt, config=DecodingConfig(seed=8, **config)).responses
    assert torch.equal(first, again) and not torch.equal(first, other)


# --- hooks ------------------------------------------------------------------------------------------


def _two_samples() -> Script:
    """Row with prompt token 1: three words then EOS, all confident (1 forward). Row with prompt token 2:
    8 unconfident tokens (8 forwards)."""

    def script(ids, positions):
        fast = (ids[:, :1] == 1).expand_as(ids)
        response = positions - 2
        tokens = torch.where(fast & (response == 3), EOS, 5)
        return tokens, torch.where(fast, 0.99, 0.5).double()

    return script


def test_tokens_per_step_is_a_ratio_of_totals():
    recorder = TokensPerStepRecorder()
    model = ScriptedStudent(_two_samples())
    prompts = torch.tensor([[1, 0], [2, 0]])
    output = generate(
        model, prompts, config=DecodingConfig(gen_length=8, block_length=4), hooks=[recorder], sample_ids=["a", "b"]
    )
    assert output.nfe == 8 and output.sample_nfe.tolist() == [1, 8]
    summary = recorder.summary()
    assert summary["tokens_per_step"] == pytest.approx(11 / 9)  # the mean of per-sample ratios would be 2.0
    assert summary["nfe"] == 9 and summary["model_forwards"] == 8 and summary["generated_tokens"] == 11
    assert summary["tokens_per_second"] > 0 and summary["early_stop"] is True and "tps" not in summary
    assert recorder.per_sample()["a"] == {"tokens": 3, "non_eos_tokens": 3, "nfe": 1, "tokens_per_step": 3.0}


def test_tokens_per_step_counts_across_calls():
    recorder = TokensPerStepRecorder()
    config = DecodingConfig(gen_length=8, block_length=4)
    for prompt in ([[1, 0]], [[2, 0]]):
        generate(ScriptedStudent(_two_samples()), torch.tensor(prompt), config=config, hooks=[recorder])
    assert list(recorder.samples) == [0, 1]
    assert recorder.summary()["tokens_per_step"] == pytest.approx(11 / 9)
    assert recorder.summary()["model_forwards"] == 9


@pytest.mark.parametrize("early_stop, nfe, non_eos", [(True, 1, 4), (False, 2, 8)])
def test_non_eos_count_of_the_peers_counts_the_end_of_turn_token(early_stop, nfe, non_eos):
    """Fast-dLLM / dParallel / d3LLM count every non-EOS token: the end-of-turn token, and with early stop off
    whatever follows it; ours stops before the end-of-turn token. Both share the forwards."""
    recorder = TokensPerStepRecorder()
    config = DecodingConfig(gen_length=8, block_length=4, stop_token_ids=(EOS, EOT), early_stop=early_stop)
    model = ScriptedStudent(by_position([3, 4, 5, EOT, 7, 8, 9, 10], [0.99] * 8, 2))
    generate(model, PROMPT, config=config, hooks=[recorder])
    assert recorder.samples[0] == {"tokens": 3, "non_eos_tokens": non_eos, "nfe": nfe}
    summary = recorder.summary()
    assert summary["tokens_per_step"] == pytest.approx(3 / nfe)
    assert summary["tokens_per_forward_non_eos"] == pytest.approx(non_eos / nfe) and summary["non_eos_tokens"] == non_eos


class _Words:
    """A tokenizer stand-in that decodes token id ``i`` as the word ``w{i}``, so stop strings can cut answers."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f"w{i} " for i in ids)


@pytest.mark.parametrize("early_stop", [True, False])
def test_a_stop_string_ends_both_counts(early_stop):
    """A task stop string cutting the answer before the first stop token ends both counts at the token that
    reaches it; the recorder keeps the cut answer."""
    recorder = TokensPerStepRecorder(_Words(), stop_strings=("w5",))
    config = DecodingConfig(gen_length=8, block_length=4, stop_token_ids=(EOS, EOT), early_stop=early_stop)
    model = ScriptedStudent(by_position([3, 4, 5, EOT, 7, 8, 9, 10], [0.99] * 8, 2))
    generate(model, PROMPT, config=config, hooks=[recorder])
    assert recorder.samples[0]["tokens"] == recorder.samples[0]["non_eos_tokens"] == 2
    assert recorder.answers[0] == "w3 w4 "


def test_trajectory_decode_order_and_teacher_nll(tmp_path):
    recorder = TrajectoryRecorder()
    config = DecodingConfig(gen_length=8, block_length=4, threshold=0.9)
    tokens = [3, 4, 5, EOS] + [7] * 4
    confidences = [0.95, 0.5, 0.92, 0.3] + [0.99] * 4
    generate(ScriptedStudent(by_position(tokens, confidences, 2)), PROMPT, config=config, hooks=[recorder])
    trajectory = recorder.trajectories[0]
    assert trajectory.commit_step.tolist() == [0, 1, 0, 2, 2, 2, 2, 2]
    assert (trajectory.fill_step >= 0).tolist() == [False] * 4 + [True] * 4
    assert trajectory.commit_confidence[:4].tolist() == pytest.approx(confidences[:4], abs=1e-4)
    assert trajectory.commit_confidence[4:].isnan().all()  # set by early stop, not by the model
    assert trajectory.partial_response(0).tolist() == [3, 5]
    assert trajectory.partial_response(2).tolist() == [3, 4, 5]

    def score(ids: torch.Tensor) -> torch.Tensor:  # a "teacher" whose NLL of token t is t
        return ids.double()

    assert teacher_nll_per_step(trajectory, score).tolist() == [4.0, 4.0, 4.0]
    order, filled = recorder.decode_order()
    assert order.shape == (1, 8) and filled.sum() == 4
    plot_decode_order(order, filled, path=tmp_path / "order.png")
    plot_teacher_nll({"a": [teacher_nll_per_step(trajectory, score)]}, path=tmp_path / "nll.png")
    assert (tmp_path / "order.png").stat().st_size > 0 and (tmp_path / "nll.png").stat().st_size > 0


class _LastResponses(DecodeHook):
    def on_end(self, output) -> None:
        self.responses = output.responses.tolist()


def test_generate_text_left_pads_and_cuts_before_the_first_stop(tokenizer, qwen):
    """Batched (left-padded, prompts of different lengths) answers equal each prompt decoded alone, and each
    answer is the response decoded up to (not including) its first stop token, counted as such."""
    prompts = ["How many apples does Natalia have left?", [{"role": "user", "content": "Hi"}]]
    probe = _LastResponses()
    off = DecodingConfig(gen_length=16, block_length=8, threshold=0.2, early_stop=False)
    generate_text(qwen, tokenizer, prompts[:1], off, hooks=[probe])
    stop = next(t for t in probe.responses[0] if t != probe.responses[0][0])  # written mid-response: the stop token
    first = probe.responses[0].index(stop)
    config = DecodingConfig(gen_length=16, block_length=8, threshold=0.2, stop_token_ids=(stop,))
    recorder, batched = TokensPerStepRecorder(), _LastResponses()
    answers = generate_text(qwen, tokenizer, prompts, config, hooks=[recorder, batched], sample_ids=["a", "b"])
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": prompts[0]}], add_generation_prompt=True,
                                           tokenize=False),
             tokenizer.apply_chat_template(prompts[1], add_generation_prompt=True, tokenize=False)]
    lengths = [len(tokenizer(text, add_special_tokens=False).input_ids) for text in texts]
    assert lengths[0] > lengths[1]  # the second prompt really was left-padded
    for row, prompt in enumerate(prompts):
        assert generate_text(qwen, tokenizer, [prompt], config) == [answers[row]]
        cut = batched.responses[row].index(stop) if stop in batched.responses[row] else 16
        assert answers[row] == tokenizer.decode(batched.responses[row][:cut], skip_special_tokens=True)
        assert recorder.samples["ab"[row]]["tokens"] == cut
    assert batched.responses[0][: first + 1] == probe.responses[0][: first + 1]
    assert answers[0] == tokenizer.decode(probe.responses[0][:first], skip_special_tokens=True) != tokenizer.decode(
        probe.responses[0], skip_special_tokens=True
    )


def test_end_of_response_defaults_to_the_chat_templates_end_of_turn_then_eos():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trims_hf.prompts import end_of_response_ids

    vocab = {"<eos>": 0, "<|eot_id|>": 1, "a": 2, "<|im_end|>": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>",
                                        additional_special_tokens=["<|eot_id|>", "<|im_end|>"])
    assert end_of_response_ids(tokenizer, None) == [0]  # no chat template: EOS
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}<|eot_id|>{% endfor %}"
    assert end_of_response_ids(tokenizer, None) == [1, 0]
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}<|im_end|>\n{% endfor %}"
    assert end_of_response_ids(tokenizer, None) == [3, 0]
    assert end_of_response_ids(tokenizer, ["a"]) == [2]


def test_one_end_of_response_string_is_one_token_not_its_characters():
    """``end_of_response="<end>"`` in Python means the token, as ``end_of_response: <end>`` in a recipe does."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trims_hf import MDLMConfig, StudentFormat
    from trims_hf.data.preparation import tokenize_example
    from trims_hf.prompts import end_of_response_ids

    vocab = {"<eos>": 0, "<end>": 1, "a": 2, "<": 3, "e": 4, "n": 5, "d": 6, ">": 7}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    assert end_of_response_ids(tokenizer, "<end>") == [1]
    for fmt in (StudentFormat(prompt_format="plain", end_of_response="<end>"),
                MDLMConfig(prompt_format="plain", end_of_response="<end>", report_to="none")):
        assert fmt.end_of_response == ["<end>"]
        assert tokenize_example(tokenizer, "a", "a", fmt).input_ids[-2:] == [2, 1]
    with pytest.raises(TypeError, match=r"end_of_response=\['<end>', 3\]: must be a token or a list of tokens"):
        StudentFormat(end_of_response=["<end>", 3])


@pytest.mark.parametrize("settings,match", [
    ({"stop_token_ids": "5"}, r"^stop_token_ids='5': must be a list of token ids \(ints\)\.$"),
    ({"stop_token_ids": 5}, r"^stop_token_ids=5: must be a list of token ids"),
    ({"stop_token_ids": [5, 2.0]}, r"^stop_token_ids=\[5, 2\.0\]: must be a list of token ids"),
    ({"gen_length": 256.0}, r"^gen_length=256\.0: must be a whole number \(int\), not float\.$"),
    ({"steps": "8"}, r"^steps='8': must be a whole number"),
    ({"threshold": "0.9"}, r"^threshold='0\.9': must be a number, not str\.$"),
    ({"early_stop": "no"}, r"^early_stop='no': must be true or false \(a bool\), not str\.$"),
])
def test_decoding_settings_of_the_wrong_type_are_named(settings, match):
    with pytest.raises(TypeError, match=match):
        DecodingConfig(**settings)


def test_every_strategy_name_has_a_builder():
    from typing import get_args

    from trims_hf.generation.steps import STRATEGIES
    from trims_hf.settings import StrategyName

    assert set(STRATEGIES) == set(get_args(StrategyName))


def test_decoding_stops_at_the_end_of_response_training_appends():
    """A student trained to end responses with a custom token (StudentFormat.end_of_response) stops on it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trims_hf import StudentFormat
    from trims_hf.data.preparation import tokenize_example

    vocab = {**{f"w{i}": i for i in range(12)}, "<end>": 12, "<eot>": EOT, "<eos>": EOS, "<mask>": MASK}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<eos>",
                                        mask_token="<mask>")
    fmt = StudentFormat(prompt_format="plain", end_of_response=["<end>"])
    end = tokenize_example(tokenizer, "w1 w2", "w3", fmt).input_ids[-1]  # what training ends every response with
    assert end == 12
    model = ScriptedStudent(by_position([3, end, 4, 4], [0.9] * 4, prompt_length=2))
    model.anchor = nn.Parameter(torch.zeros(1))  # generate_text decodes where the parameters are
    recorder = TokensPerStepRecorder()
    config = DecodingConfig(gen_length=4, block_length=4, threshold=0.5)
    answers = generate_text(model, tokenizer, ["w1 w2"], config, hooks=[recorder], prompt_format=fmt)
    assert answers == ["w3"] and recorder.samples[0]["tokens"] == 1


# --- step modes: static buffers, no mask where none is needed -----------------------------------------


@pytest.mark.parametrize("padded", [False, True])
def test_static_step_attends_without_a_mask_unless_a_row_is_padded(monkeypatch, llama, tokenizer, padded):
    """SDPA gets no mask (so it may pick its flash kernels) when no row is padded, else one additive mask that
    broadcasts over heads and queries and hides exactly the padding; every call of the generation shares it."""
    masks = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ids, mask = _left_pad(PROMPTS if padded else PROMPTS[:1], tokenizer.pad_token_id)
    config = DecodingConfig(gen_length=16, block_length=8, threshold=0.5, cache="dual", early_stop=False, step="static")
    generate(llama, ids, mask, config)
    assert masks
    if not padded:
        assert all(m is None for m in masks)
        return
    assert len({m.data_ptr() for m in masks}) == 1 and masks[0].dtype == llama.dtype
    keep = torch.cat([mask, torch.ones(len(PROMPTS), 16, dtype=torch.long)], dim=1).bool()[:, None, None, :]
    assert masks[0].shape == keep.shape and torch.equal(masks[0] == 0, keep)
    assert bool((masks[0][~keep] == torch.finfo(llama.dtype).min).all())


@pytest.mark.parametrize("kind", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_static_buffers_are_allocated_once_and_written_in_place(request, kind, cache):
    """Across refreshes and windows the cache keeps one buffer per layer (no per-step allocation), holding exactly
    what the eager cache holds after the same calls."""
    model = request.getfixturevalue("llama" if kind == "llada" else "qwen")
    ids, mask = _left_pad(PROMPTS, 1)
    x = torch.cat([ids, torch.randint(3, 300, (3, 16), generator=torch.Generator().manual_seed(0))], dim=1)
    mask = torch.cat([mask, torch.ones(3, 16, dtype=torch.long)], dim=1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    forwards = {step: StudentForward(model, student_spec(model), cache, mask, positions, step=step)
                for step in ("eager", "static")}
    pointers = set()
    with torch.no_grad():
        for start in (ids.shape[1], ids.shape[1] + 8):
            for call in range(3):
                logits = {step: forward(x, start, start + 8, call == 0) for step, forward in forwards.items()}
                torch.testing.assert_close(logits["static"], logits["eager"], atol=0, rtol=0)
                layer = forwards["static"].cache.layers[0]
                pointers.add((layer.keys.data_ptr(), layer.values.data_ptr()))
                torch.testing.assert_close(layer.keys, forwards["eager"].cache.layers[0].keys, atol=0, rtol=0)
                x[:, start + call] = (x[:, start + call] + 1) % 300  # the next call sees a changed block
    assert len(pointers) == 1


def test_step_mode_is_resolved_per_device_and_student(tokenizer, llama):
    from trims_hf.generation.cache import resolve_step
    from trims_hf.students import STUDENTS

    cpu = torch.device("cpu")
    assert resolve_step("auto", cpu, STUDENTS["llada"], llama) == "static"
    assert resolve_step("auto", torch.device("cuda"), STUDENTS["dream"], llama) == "graph"
    assert resolve_step("auto", torch.device("cuda"), STUDENTS["masked_lm"], llama) == "eager"
    with pytest.raises(ValueError, match="CUDA graphs"):
        generate(llama, torch.tensor([PROMPTS[0]]), config=DecodingConfig(gen_length=8, block_length=8, step="graph"))
    with pytest.raises(ValueError, match="masked LMs decode with step='eager'"):
        resolve_step("static", cpu, STUDENTS["masked_lm"], llama)
    with pytest.raises(ValueError, match="step"):
        DecodingConfig(step="compiled")


@pytest.mark.parametrize("kind", ["llada_moe", "llada2"])
def test_moe_experts_no_graph_can_capture_run_static_and_refuse_the_graph_step(original_checkpoint, monkeypatch, kind):
    """torch's grouped GEMM reads the experts' token counts on the host outside bfloat16 on compute capability 9.x /
    10.x, and transformers' eager experts loop does always: no CUDA graph captures them, so on CUDA ``auto`` runs such
    a student static and ``graph`` is refused in one line (the capability is faked: the rule reads no CUDA tensor)."""
    from trims_hf import load_student
    from trims_hf.generation.cache import resolve_step, uncapturable_experts

    cuda, capability = torch.device("cuda"), [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability[0])
    folder = str(original_checkpoint(kind))
    fp32, bf16 = (load_student(folder, dtype=dtype) for dtype in (torch.float32, torch.bfloat16))
    spec = student_spec(fp32)

    def refused(model: nn.Module, reason: str) -> None:
        assert resolve_step("auto", cuda, spec, model) == "static"
        assert resolve_step("static", cuda, spec, model) == "static"
        with pytest.raises(ValueError, match=f"step='graph' cannot capture this student.*{reason}.*use step='static'"
                           ) as error:
            resolve_step("graph", cuda, spec, model)
        assert "\n" not in str(error.value)

    refused(fp32, "its float32 experts run torch's grouped GEMM as a loop")
    assert resolve_step("auto", cuda, spec, bf16) == resolve_step("graph", cuda, spec, bf16) == "graph"
    assert resolve_step("auto", torch.device("cpu"), spec, bf16) == "static"
    capability[0] = (8, 0)  # an A100: the grouped GEMM's loop in bfloat16 too
    refused(bf16, "compute capability 8.0")
    capability[0] = (10, 0)
    assert uncapturable_experts(bf16, cuda) is None
    bf16.set_experts_implementation("eager")
    refused(bf16, "eager loop")
    fp32.set_experts_implementation("batched_mm")  # fixed shapes: gathered weights and a batched matmul
    assert resolve_step("auto", cuda, spec, fp32) == "graph"


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_a_right_padded_prompt_is_refused_before_any_forward(kind):
    model = ScriptedStudent(by_position([3, 4, 5, 6], [0.9] * 4, 3), kind)
    prompts, mask = torch.tensor([[1, 2, 0], [1, 2, 3]]), torch.tensor([[1, 1, 0], [1, 1, 1]])
    with pytest.raises(ValueError, match="prompts must be left-padded: row 0") as error:
        generate(model, prompts, mask, DecodingConfig(gen_length=4, block_length=4, early_stop=False))
    assert "\n" not in str(error.value) and model.inputs == []
    left = generate(model, prompts, torch.tensor([[0, 1, 1], [1, 1, 1]]),
                    DecodingConfig(gen_length=4, block_length=4, early_stop=False))  # left padding still decodes
    assert left.responses.shape == (2, 4)


def _mutated(config: DecodingConfig, **fields) -> DecodingConfig:
    for name, value in fields.items():
        setattr(config, name, value)
    return config


HOSTILE_DECODES = {
    "id past the vocabulary": (dict(input_ids=torch.tensor([[1, VOCAB + 3, 2]])),
                               rf"input_ids: {VOCAB + 3} at row 0, column 1 is not a token id of the model's vocabulary "
                               rf"\(0 to {VOCAB - 1}\)"),
    "negative id": (dict(input_ids=torch.tensor([[1, -100, 2]])), r"input_ids: -100 at row 0, column 1 is not a token id"),
    "one row, 1-D": (dict(input_ids=torch.tensor([1, 2, 3])), r"input_ids: a 2-D tensor of token ids .*got \(3,\)"),
    "a list": (dict(input_ids=[[1, 2]]), r"input_ids: a 2-D tensor of token ids .*got list"),
    "float ids": (dict(input_ids=torch.tensor([[1.0, 2.0]])), r"input_ids: a 2-D tensor .* torch\.float32"),
    "empty prompt": (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), r"input_ids: row 0 has no real prompt token"),
    "no rows": (dict(input_ids=torch.zeros(0, 3, dtype=torch.long)), r"input_ids: no prompts given"),
    "all-padding row": (dict(attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]])),
                        r"input_ids: row 1 has no real prompt token"),
    "mask of 2s": (dict(attention_mask=torch.tensor([[0, 2, 2], [1, 1, 1]])),
                   r"attention_mask: 1 for a real prompt token and 0 for padding, nothing else \(got \[2\]\)"),
    "mask of halves": (dict(attention_mask=torch.tensor([[0.0, 0.5, 1.0], [1.0, 1.0, 1.0]])),
                       r"attention_mask: 1 for a real .*got \[0\.5\]"),
    "mask of another shape": (dict(attention_mask=torch.tensor([[1, 1], [1, 1]])),
                              r"attention_mask: shape \(2, 2\), not input_ids' \(2, 3\)"),
    "past the positions": (dict(config=DecodingConfig(gen_length=64, block_length=8, early_stop=False)),
                           r"gen_length=64 after a prompt of 3 tokens reaches position 66, past the model's "
                           r"max_position_embeddings=48"),
    "too few sample ids": (dict(sample_ids=["a"]), r"sample_ids: 1 names for 2 rows; name every row once"),
    "stop id is the mask": (dict(config=DecodingConfig(gen_length=4, block_length=4, stop_token_ids=[MASK],
                                                       eos_token_id=EOS)),
                            rf"stop_token_ids: {MASK} is the student's mask id"),
    "EOS is the mask": (dict(config=DecodingConfig(gen_length=4, block_length=4, eos_token_id=MASK)),
                        rf"eos_token_id={MASK} is the student's mask id"),
    "config changed after it was made": (dict(config=_mutated(DecodingConfig(gen_length=4, block_length=4),
                                                              gen_length=6)),
                                         r"gen_length=6 must be a positive multiple of block_length=4"),
    "threshold set to NaN after": (dict(config=_mutated(DecodingConfig(gen_length=4, block_length=4),
                                                        threshold=float("nan"))), r"threshold=nan"),
}


@pytest.mark.parametrize("kind", ["llada", "dream"])
@pytest.mark.parametrize("case", HOSTILE_DECODES)
def test_prompts_the_decoder_would_read_wrongly_are_one_line_before_any_forward(case, kind):
    """Each of these decoded before, to plausible tokens or a traceback from inside the model; now one line naming
    what to change, and the model never runs. The well-formed call beside them decodes."""
    model = ScriptedStudent(by_position([3, 4, 5, 6], [0.9] * 4, 3), kind)
    model.config.max_position_embeddings = 48
    call = dict(input_ids=torch.tensor([[1, 2, 3], [4, 5, 6]]), attention_mask=None,
                config=DecodingConfig(gen_length=4, block_length=4, early_stop=False), sample_ids=None)
    assert generate(model, **call).responses.shape == (2, 4) and model.inputs
    model.inputs.clear()
    fields, message = HOSTILE_DECODES[case]
    with pytest.raises(ValueError, match=message) as error:
        generate(model, **{**call, **fields})
    assert "\n" not in str(error.value) and model.inputs == []


def test_generate_text_takes_a_list_of_prompts(tokenizer):
    """One string would decode each of its characters as a prompt; an empty list has nothing to pad."""
    model = tiny_student(tokenizer)
    config = DecodingConfig(gen_length=4, block_length=4)
    with pytest.raises(ValueError, match=r"^prompts: a list of prompts \(wrap one prompt in a list\)\.$"):
        generate_text(model, tokenizer, "hi", config)
    with pytest.raises(ValueError, match=r"^prompts: a list of prompts; got none\.$"):
        generate_text(model, tokenizer, [], config)
    assert len(generate_text(model, tokenizer, ["hi"], config)) == 1


def test_threshold_quota_at_a_temperature_scores_the_tempered_probability():
    """LLaDA 2.x's ``_sample_with_temperature_topk_topp``: the threshold is compared with the sampled token's
    probability under softmax(logits / T); the quota (one per step here) takes the rest."""
    tokens, untempered, temperature, tau = [3, 4, 5, 6], [0.8, 0.8, 0.5, 0.3], 0.5, 0.95
    config = DecodingConfig(strategy="threshold_quota", threshold=tau, steps=4, gen_length=4, block_length=4,
                            temperature=temperature, seed=0, early_stop=False)
    output, hook, _ = run(by_position(tokens, untempered, 2), config)

    def tempered(c: float) -> float:  # the scripted token's probability, the others share 1 - c evenly
        logits = torch.log(torch.tensor([c] + [(1 - c) / (VOCAB - 1)] * (VOCAB - 1), dtype=torch.float64))
        return float((logits / temperature).softmax(-1)[0])

    above = [j for j, c in enumerate(untempered) if tempered(c) > tau]
    assert above == [0, 1] and all(c < tau for c in untempered)  # the untempered rule would commit only the best
    assert hook.steps[0] == (0, above, [])
    assert output.responses[0, :2].tolist() == tokens[:2]


def test_threshold_quota_at_temperature_zero_scores_the_model_probability():
    config = DecodingConfig(strategy="threshold_quota", threshold=0.75, steps=4, gen_length=4, block_length=4,
                            early_stop=False)
    _, hook, _ = run(by_position([3, 4, 5, 6], [0.8, 0.7, 0.76, 0.3], 2), config)
    assert hook.steps[0] == (0, [0, 2], [])
