"""Correctness under the device's own kernels and bf16: each check runs on the CPU here and on CUDA
wherever a GPU is present (skipped otherwise), on the reference fixtures loaded through ``load_student``.

- Attention is bidirectional: position 0's logits move when only the last token changes (and a causal twin of the
  same weights, the contrast, does not move).
- The MDLM loss in bf16 is within 0.2% (relative) of fp32 on the same batch: measured 0.033% on the CPU (bf16 keeps 8
  significant bits, and the loss averages per-token errors that are largely independent); 0.2% leaves 6x for the
  device's other accumulation orders. Weights rounded to fp8 e4m3 (4 significant bits) move it by ~1% (checked, so
  the tolerance can fail at its own scale). The loss of bf16 logits is the fp32 loss of those same logits (the
  masked tokens' logits are upcast before the cross-entropy), to fp32 rounding.
- A LoRA adapter saved and loaded back gives bit-identical logits (same weights, same kernels), and the adapter
  changes the logits (so a reload that dropped it would fail); merged into the weights as the evaluation loads it
  (``merge_and_unload``) it gives the unmerged logits to fp32 rounding in fp32, and in bf16 stays within twice bf16's
  own error against the fp32 reference (merging rounds W + BA once more).
- Cached decoding at threshold 0 (each block decided at its refreshing full forward) equals no cache exactly, on a
  left-padded batch of the fixture prompts (``tests/test_generation.py`` establishes the same on the CPU).
- The threshold decoder on the fixture prompts: fp32 on the device reproduces the reference traces exactly, and at
  every state of those trajectories whose fp32 decision margins exceed :data:`LOGIT_MARGIN` / :data:`PROB_MARGIN`
  bf16 commits the same positions and tokens (bf16 moves the fixture logits by up to 0.57, so smaller margins may
  legitimately flip, and one flip changes every later state: hence the comparison per state, not per run); a free
  bf16 ``generate`` run follows the fp32 one until a state whose fp32 margins are unclear (its first difference is
  at such a state).
- Every step mode commits the eager step's tokens, and so do compiled decoder blocks (``compile_blocks``) on the
  fixture prompts, under the static step and the graph step that captures them. The MoE students' experts are
  captured in bfloat16 on compute capability 9.x / 10.x only; elsewhere (float32) the graph step is refused before any
  forward and the default step runs static.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from conftest import FIXTURES, tiny_student
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, PreTrainedConfig

from trims_hf import TrimsDataCollator, load_student, lora_config
from trims_hf.generation import DecodeHook, DecodingConfig, StepRecord, StudentForward, generate
from trims_hf.generation.cache import CapturedCalls
from trims_hf.generation.steps import build_strategy
from trims_hf.settings import MaskingConfig
from trims_hf.students import STUDENTS, compile_blocks, student_spec
from trims_hf.students.loss import mdlm_loss, per_sample_loss

TRACES = json.loads((FIXTURES / "decode_traces.json").read_text())
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs CUDA (bench/gpu/run_all.sh runs these on a GPU)")),
]
LOSS_TOLERANCE = 0.002
LOGIT_MARGIN = 1.5
"""Top-1 minus top-2 logit an fp32 decision needs before bf16 must reproduce it: ~2.5x the largest bf16-vs-fp32
logit difference on the LLaDA fixture's parity inputs (0.57, logits up to 22)."""
MASK_ID = 255
PROB_MARGIN = 0.1
"""Distance of an fp32 confidence from the threshold, and between the two most confident candidates, likewise."""


def student(kind: str, device: str, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    return load_student(str(FIXTURES / f"{kind}_tiny"), dtype=dtype).to(device).eval()


def causal_twin(kind: str, device: str, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """The same checkpoint through the same config translation, but left causal (no prepare_student)."""
    path = FIXTURES / f"{kind}_tiny"
    spec = STUDENTS[kind]
    config = spec.translate_config(PreTrainedConfig.get_config_dict(str(path))[0])
    model = AutoModelForCausalLM.from_pretrained(str(path), config=config, key_mapping=spec.key_mapping, dtype=dtype)
    return model.to(device).eval()


def first_position_shift(model: torch.nn.Module, device: str, padded: bool) -> float:
    """Largest change of the first real token's logits when only the last token changes (0 for causal attention).
    ``padded`` sends a left-padded batch with its attention mask, the mask path of the kernels."""
    ids = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :5] = 0
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 7) % 250
    first = mask.argmax(dim=1)
    with torch.no_grad():
        before, after = (model(input_ids=x.to(device), attention_mask=mask.to(device) if padded else None).logits.float()
                         for x in (ids, changed))
    rows = torch.arange(2, device=device)
    return float((before[rows, first.to(device)] - after[rows, first.to(device)]).abs().max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["llada", "dream"])
@pytest.mark.parametrize("padded", [False, True], ids=["no-mask", "left-padded"])
def test_attention_is_bidirectional(device, kind, padded):
    assert first_position_shift(student(kind, device), device, padded) > 1e-2
    assert first_position_shift(causal_twin(kind, device), device, padded) == 0.0  # the check can fail


def loss_of(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: str) -> float:
    batch = {key: value.to(device) for key, value in batch.items()}
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return float(mdlm_loss(logits, batch["labels"], batch["masked"], batch["loss_weights"], student_spec(model)))


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_loss_matches_fp32(device):
    rows = [{"input_ids": torch.randint(0, 250, (96,), generator=torch.Generator().manual_seed(i)).tolist(),
             "prompt_length": 16, "bucket_ids": [i % 8 for i in range(80)], "example_id": i} for i in range(8)]
    tokenizer = type("Tokenizer", (), {"eos_token_id": 254, "mask_token_id": 255})()
    collator = TrimsDataCollator(tokenizer, masking=MaskingConfig(trajectory_ratio=0.5))
    batch, other_draw = collator(rows), TrimsDataCollator(tokenizer, masking=collator.masking, seed=1)(rows)
    fp32 = loss_of(student("llada", device, torch.float32), batch, device)
    bf16 = loss_of(student("llada", device, torch.bfloat16), batch, device)
    assert abs(bf16 - fp32) <= LOSS_TOLERANCE * fp32
    coarse = student("llada", device, torch.float32)
    with torch.no_grad():
        for parameter in coarse.parameters():
            parameter.copy_(parameter.to(torch.float8_e4m3fn).float())
    assert 2 * LOSS_TOLERANCE * fp32 < abs(loss_of(coarse, batch, device) - fp32) < 20 * LOSS_TOLERANCE * fp32
    assert abs(loss_of(student("llada", device, torch.float32), other_draw, device) - fp32) > LOSS_TOLERANCE * fp32


@pytest.mark.parametrize("device", DEVICES)
def test_loss_upcasts_bf16_logits_before_the_cross_entropy(device):
    """bf16 cross-entropy would round each token's loss to 8 bits; the loss of bf16 logits is their fp32 loss."""
    model = student("llada", device)
    ids = torch.randint(0, 250, (4, 32), generator=torch.Generator().manual_seed(0))
    masked = torch.rand(4, 32, generator=torch.Generator().manual_seed(1)) < 0.5
    batch = {"labels": ids.to(device), "masked": masked.to(device), "loss_weights": torch.ones(4, device=device)}
    with torch.no_grad():
        logits = model(input_ids=torch.where(masked, MASK_ID, ids).to(device)).logits
    spec = student_spec(model)
    loss = per_sample_loss(logits, batch["labels"], batch["masked"], batch["loss_weights"], spec)
    upcast = per_sample_loss(logits.float(), batch["labels"], batch["masked"], batch["loss_weights"], spec)
    assert loss.dtype == torch.float32 and torch.allclose(loss, upcast, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_lora_adapter_reload_gives_identical_logits(device, tmp_path):
    model = student("llada", device)
    ids = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        base = model(input_ids=ids).logits
    peft = get_peft_model(model, lora_config(model))
    torch.manual_seed(0)
    for name, parameter in peft.named_parameters():
        if "lora_B" in name:  # B starts at zero: give the adapter an effect
            torch.nn.init.normal_(parameter, std=0.1)
    peft.eval()
    with torch.no_grad():
        adapted = peft(input_ids=ids).logits
    peft.save_pretrained(tmp_path)
    reloaded = PeftModel.from_pretrained(student("llada", device), tmp_path).eval()
    with torch.no_grad():
        again = reloaded(input_ids=ids).logits
    assert torch.equal(again, adapted)
    assert (adapted - base).abs().max() > 1e-2  # the adapter matters, so dropping it would fail the check


@pytest.mark.parametrize("device", DEVICES)
def test_merged_lora_gives_the_unmerged_logits(device, tmp_path):
    """The evaluation's path (trims_hf/evaluation/harness/model.py): ``PeftModel.from_pretrained(...).merge_and_unload()``."""
    model = student("llada", device, torch.float32)
    peft = get_peft_model(model, lora_config(model))
    torch.manual_seed(0)
    for name, parameter in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.1)
    peft.save_pretrained(tmp_path)
    ids = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(0)).to(device)
    logits = {}
    for dtype in (torch.float32, torch.bfloat16):
        for merged in (False, True):
            loaded = PeftModel.from_pretrained(student("llada", device, dtype), tmp_path)
            with torch.no_grad():
                logits[dtype, merged] = (loaded.merge_and_unload() if merged else loaded).eval()(input_ids=ids).logits.float()
    reference = logits[torch.float32, False]
    assert (logits[torch.float32, True] - reference).abs().max() < 1e-4 * reference.abs().max()  # measured 2.4e-6
    bf16_error = (logits[torch.bfloat16, False] - reference).abs().max()
    assert (logits[torch.bfloat16, True] - reference).abs().max() <= 2 * bf16_error
    with torch.no_grad():
        base = student("llada", device, torch.float32)(input_ids=ids).logits
    assert (base - reference).abs().max() > 2 * bf16_error  # an adapter lost in merging would fail both checks


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cache_equals_no_cache_at_threshold_0(device, cache, dtype):
    model = student("llada", device, dtype)
    runs = [run for run in TRACES["runs"] if run["decoder"] == "threshold" and run["threshold"] == 0.0]
    width = max(len(run["prompt_ids"]) for run in runs)
    ids = torch.tensor([[0] * (width - len(run["prompt_ids"])) + run["prompt_ids"] for run in runs], device=device)
    mask = torch.arange(width, device=device) >= width - torch.tensor([len(run["prompt_ids"]) for run in runs],
                                                                      device=device)[:, None]
    settings = TRACES["settings"]
    config = DecodingConfig(gen_length=settings["gen_length"], block_length=settings["block_length"], threshold=0.0,
                            early_stop=False)
    reference = generate(model, ids, mask.long(), config=config)
    cached = generate(model, ids, mask.long(), config=replace(config, cache=cache))
    assert torch.equal(cached.sequences, reference.sequences)
    assert torch.equal(cached.sample_nfe, reference.sample_nfe)


@dataclass
class _Step:
    block: int
    before: torch.Tensor
    """The response before this step (mask id where masked)."""
    commits: list[tuple[int, int]]


class _Recorder(DecodeHook):
    def __init__(self, gen_length: int) -> None:
        self.steps: list[_Step] = []
        self._state = torch.full((gen_length,), MASK_ID)

    def on_step(self, record: StepRecord) -> None:
        positions, tokens, _ = record.commits(0)
        self.steps.append(_Step(record.block, self._state, list(zip(positions.tolist(), tokens.tolist()))))
        self._state = record.tokens[0].cpu()


def threshold_runs() -> list[tuple[dict, DecodingConfig]]:
    settings = TRACES["settings"]
    return [(run, DecodingConfig(gen_length=settings["gen_length"], block_length=settings["block_length"],
                                 threshold=run["threshold"], early_stop=False))
            for run in TRACES["runs"] if run["decoder"] == "threshold"]


def decode_steps(model: torch.nn.Module, run: dict, config: DecodingConfig, device: str) -> list[_Step]:
    recorder = _Recorder(config.gen_length)
    generate(model, torch.tensor([run["prompt_ids"]], device=device), config=config, hooks=[recorder])
    return recorder.steps


@dataclass(frozen=True)
class _Decision:
    commits: list[tuple[int, int]]
    clear: bool
    """Every decision of the step has margins beyond the stated bounds: the committed tokens (top-1 minus top-2
    logit), every candidate's side of the threshold, and, when none reaches it, which candidate is the best."""


def step_decision(model: torch.nn.Module, prompt: list[int], step: _Step, config: DecodingConfig, device: str,
                  kind: str = "llada") -> _Decision:
    """What the decoder commits at this state: proposals and float64 confidences as the reference decoder defines
    them (fixtures README §3), the commit set by the library's own strategy."""
    block = slice(step.block * config.block_length, (step.block + 1) * config.block_length)
    candidates = step.before[block] == MASK_ID
    x = torch.tensor([prompt + step.before.tolist()], device=device)
    with torch.no_grad():
        logits = STUDENTS[kind].align_logits(model(input_ids=x).logits)[0, len(prompt):][block].double().cpu()
    confidence, tokens = logits.softmax(-1).max(-1)
    commit = build_strategy(config).select(confidence[None], candidates[None], 0, candidates.sum()[None])[0]
    top = logits.topk(2, dim=-1).values
    clear = bool(((top[:, 0] - top[:, 1]) > LOGIT_MARGIN)[commit].all())
    if config.threshold > 0:
        clear &= bool(((confidence - config.threshold).abs() > PROB_MARGIN)[candidates].all())
    ranked = confidence[candidates].sort(descending=True).values
    if len(ranked) > 1 and ranked[0] < config.threshold:  # only the best is committed: which one must be clear
        clear &= bool(ranked[0] - ranked[1] > PROB_MARGIN)
    offset = block.start
    return _Decision([(offset + i, int(tokens[i])) for i in commit.nonzero().squeeze(-1).tolist()], clear)


def compare_where_margins_allow(reference: torch.nn.Module, other: torch.nn.Module, device: str,
                                kind: str = "llada") -> tuple[int, int]:
    """Over every state of the reference's threshold-decoding trajectories: (steps with clear fp32 margins,
    of which ``other`` commits differently)."""
    compared = mismatched = 0
    for run, config in threshold_runs():
        for step in decode_steps(reference, run, config, device):
            expected = step_decision(reference, run["prompt_ids"], step, config, device, kind)
            assert expected.commits == step.commits  # the decision rule here is the decoder's
            if expected.clear:
                compared += 1
                mismatched += step_decision(other, run["prompt_ids"], step, config, device, kind).commits != expected.commits
    return compared, mismatched


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_decoder_matches_fp32_where_margins_allow(device):
    fp32 = student("llada", device, torch.float32)
    for run, config in threshold_runs():  # fp32 on this device is the reference decoder, step for step
        assert [s.commits for s in decode_steps(fp32, run, config, device)] == [
            [(c["pos"] - run["prompt_length"], c["token"]) for c in step["committed"]] for step in run["per_step"]]
    compared, mismatched = compare_where_margins_allow(fp32, student("llada", device, torch.bfloat16), device)
    assert compared >= 5 and mismatched == 0  # 9 of the 80 states on the CPU
    assert compare_where_margins_allow(fp32, causal_twin("llada", device), device)[1] > 0  # the check can fail


@pytest.mark.parametrize("device", DEVICES)
def test_free_bf16_run_leaves_fp32_only_where_margins_are_unclear(device):
    fp32, bf16 = student("llada", device, torch.float32), student("llada", device, torch.bfloat16)
    clear_states_followed = 0
    for run, config in threshold_runs():
        reference, free = decode_steps(fp32, run, config, device), decode_steps(bf16, run, config, device)
        for index, step in enumerate(reference):
            clear = step_decision(fp32, run["prompt_ids"], step, config, device).clear
            if index < len(free) and free[index].commits == step.commits:
                clear_states_followed += clear
                continue
            assert not clear, f"threshold {run['threshold']}, prompt {run['prompt_index']}: bf16 left fp32 at clear state {index}"
            break
    assert clear_states_followed >= 1  # 2 on the CPU: the check reaches clear states


STEP_MODES = {"cpu": ("static",), "cuda": ("static", "graph")}
"""The step modes each device checks against eager (CUDA graphs exist only on CUDA)."""


class _AllCommits(DecodeHook):
    """Every step's commits and EOS fills, all rows."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, list[list[int]], list[list[int]]]] = []

    def on_step(self, record: StepRecord) -> None:
        self.steps.append((record.block, record.committed.nonzero().tolist(), record.filled.nonzero().tolist()))


def fixture_prompts(device: str, padded: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fixture's prompts, cut to 10, 6 and 3 tokens (one shorter than a block), left-padded with their mask; or the
    first one alone with no mask."""
    prompts = [run["prompt_ids"][:length] for run, length in zip(TRACES["runs"], (10, 6, 3))]
    if not padded:
        return torch.tensor(prompts[:1], device=device), None
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    return ids, (torch.arange(width, device=device) >= width - lengths[:, None]).long()


def assert_commits_of_eager(eager_model: torch.nn.Module, model: torch.nn.Module, device: str,
                            variants: dict[str, dict[str, Any]], name: str,
                            caches: tuple[str, ...] = ("none", "prefix", "dual")) -> None:
    """At every cache mode of ``caches``, batch 1 and a left-padded batch, early stop off and on, each variant
    (``DecodingConfig`` fields) of ``model`` commits the same positions and tokens at each step, fills the same EOS and
    costs the same forwards as ``eager_model`` at the eager step."""
    settings = TRACES["settings"]
    base = DecodingConfig(gen_length=settings["gen_length"], block_length=settings["block_length"], threshold=0.5,
                          early_stop=False, step="eager")
    early_stops = 0
    for padded in (False, True):
        ids, mask = fixture_prompts(device, padded)
        for cache in caches:
            plain = generate(eager_model, ids, mask, replace(base, cache=cache))
            # A stop token the run does commit in its second block, so early stop has something to cut.
            stop = int(plain.responses[0, settings["block_length"] + 1])
            for early_stop in (False, True):
                config = replace(base, cache=cache, early_stop=early_stop, stop_token_ids=[stop],
                                 eos_token_id=eager_model.config.eos_token_id)
                eager_steps = _AllCommits()
                eager = generate(eager_model, ids, mask, config, hooks=[eager_steps])
                early_stops += early_stop and not torch.equal(eager.sequences, plain.sequences)
                for label, fields in variants.items():
                    steps = _AllCommits()
                    other = generate(model, ids, mask, replace(config, **fields), hooks=[steps])
                    context = f"{name} padded={padded} cache={cache} early_stop={early_stop} {label}"
                    assert torch.equal(other.sequences, eager.sequences), context
                    assert other.nfe == eager.nfe and torch.equal(other.sample_nfe, eager.sample_nfe), context
                    assert steps.steps == eager_steps.steps, context
    assert early_stops > 0  # early stop did cut some run, so the comparison covered its fills


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["llada", "dream"])
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)],
                         ids=["fp32", "bf16"])
def test_every_step_mode_commits_the_eager_tokens(device, kind, dtype):
    """Static buffers (and CUDA graphs) change how a forward runs, not what it computes."""
    model = student(kind, device, dtype)
    assert_commits_of_eager(model, model, device, {f"step={step}": {"step": step} for step in STEP_MODES[device]},
                            f"{kind} {dtype}")


class _Blocks(DecodeHook):
    """Steps per block."""

    def __init__(self) -> None:
        self.steps: Counter[int] = Counter()

    def on_step(self, record: StepRecord) -> None:
        self.steps[record.block] += 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", [pytest.param("llada_moe", marks=pytest.mark.slow), "llada2"])  # LLaDA-MoE's
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)],  # steps in the
                         ids=["fp32", "bf16"])                                # inner loop: test_new_students.py
def test_moe_students_every_step_mode_commits_the_eager_tokens(original_checkpoint, monkeypatch, device, kind, dtype):
    """The MoE students under every step mode they run (grouped-GEMM experts; LLaDA 2.x's block-causal decoder with
    buffers and graphs of its own per block, prefix cache only) commit the eager step's tokens. On CUDA torch's grouped
    GEMM reads the experts' token counts on the host outside bfloat16 on compute capability 9.x / 10.x, which no graph
    can capture: there the graph step is refused in one line before any forward and ``auto`` runs static (a forward
    per step); in bfloat16 on such a GPU ``auto`` is the graph step, which replays every cached step after a block's
    third."""
    model = load_student(str(original_checkpoint(kind)), dtype=dtype).to(device).eval()
    capturable = (device == "cuda" and dtype == torch.bfloat16
                  and torch.cuda.get_device_capability(device)[0] in (9, 10))
    caches = ("none", "prefix") if kind == "llada2" else ("none", "prefix", "dual")
    steps = STEP_MODES[device] if capturable or device == "cpu" else ("static",)
    assert_commits_of_eager(model, model, device, {f"step={step}": {"step": step} for step in steps},
                            f"{kind} {dtype}", caches)
    if device == "cpu":
        return
    ids, mask = fixture_prompts(device, padded=False)
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    settings = DecodingConfig(gen_length=TRACES["settings"]["gen_length"],
                              block_length=TRACES["settings"]["block_length"], threshold=0.5, cache="prefix",
                              early_stop=False)  # every block decoded
    shapes: list[Counter] = []  # per CapturedCalls (one per generation; LLaDA 2.x: one per block), uses per call shape
    capture = CapturedCalls.__call__

    def recorded(self, key, inputs, run):
        if not hasattr(self, "uses"):
            self.uses = Counter()
            shapes.append(self.uses)
        self.uses[key] += 1
        return capture(self, key, inputs, run)

    monkeypatch.setattr(CapturedCalls, "__call__", recorded)
    blocks = _Blocks()
    try:
        if not capturable:
            with pytest.raises(ValueError, match="step='graph' cannot capture this student.*step='static'"):
                generate(model, ids, mask, replace(settings, step="graph"))
            assert calls == []
        output = generate(model, ids, mask, settings, hooks=[blocks])
    finally:
        handle.remove()
    if not capturable:
        assert shapes == [] and len(calls) == output.nfe
        return
    # A call shape's first call runs eagerly, its second warms up and captures (two forwards), later ones replay.
    assert len(calls) == sum(1 if uses == 1 else 3 for shape in shapes for uses in shape.values()) < output.nfe
    if kind == "llada2":
        # Per block: its first call's shape once, and one shape all its cached steps share, so at most 4 forwards. The
        # decoder runs from the block holding the prompt's end to the one holding the last generated position: for
        # the 10-token prompt, 32 tokens in blocks of 8, 5 blocks (one more than gen_length / block_length).
        prompt, size = ids.shape[1], settings.block_length
        assert len(shapes) == len(blocks.steps) == -(-(prompt + settings.gen_length) // size) - prompt // size
        assert all(len(shape) <= 2 for shape in shapes) and len(calls) <= 4 * len(blocks.steps)


COMPILED_CASES = [
    *(pytest.param("cuda", kind, dtype, id=f"cuda-{kind}-{name}", marks=DEVICES[1].marks)
      for kind in ("llada", "dream") for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))),
    pytest.param("cpu", "llada", torch.float32, id="cpu-llada-fp32"),
    pytest.param("cpu", "dream", torch.bfloat16, id="cpu-dream-bf16"),
]
"""Every student and dtype on CUDA; on the CPU, where compiling takes tens of seconds a case, each student and each
dtype once."""


@pytest.mark.slow
@pytest.mark.parametrize(("device", "kind", "dtype"), COMPILED_CASES)
def test_compiled_blocks_commit_the_eager_tokens(device, kind, dtype):
    """Compiled decoder blocks (``DecodingConfig.compile_blocks``) fuse the elementwise work into other kernels, whose
    roundings differ from eager's. In float32 that moves no token: on the fixture prompts every step commits what the
    uncompiled eager step commits, at every cache mode, under the static step and (CUDA) the graph step that captures
    the fused kernels. In bfloat16 it does (the fused kernels keep float32 between ops where eager rounds to bf16), so
    the compiled bf16 student is held to what the eager bf16 one is: the fp32 decoder's commits at every state whose
    fp32 margins are clear, and logits no further from fp32's than twice eager bf16's.

    Every block runs compiled: dynamo, which would run a block past its recompile limit eagerly, raises instead."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # every graph is this test's own, counted
    counters.clear()
    compiled = student(kind, device, dtype)
    steps = {f"step={step}, compiled": {"step": step, "compile_blocks": True} for step in STEP_MODES[device]}
    with torch._dynamo.config.patch(recompile_limit=8, accumulated_recompile_limit=256, fail_on_recompile_limit_hit=True):
        if dtype == torch.float32:
            assert_commits_of_eager(student(kind, device, dtype), compiled, device, steps, f"{kind} {dtype}")
        else:
            assert_held_to_eager_bf16(compiled, device, kind, dtype)
    assert counters["frames"]["total"] == counters["frames"]["ok"]
    assert all(layer._compiled_call_impl is not None for layer in compiled.model.layers)


DEPTH_CASES = [pytest.param("cpu", ("static", "eager"), id="cpu"),
               pytest.param("cuda", ("static", "graph"), id="cuda", marks=DEVICES[1].marks)]
"""Per device, the step modes whose compiled blocks must share their graphs: the eager step keeps the cache's fresh
tensors (another cache layer class), the graph step captures the compiled blocks."""


@pytest.mark.slow
@pytest.mark.parametrize(("device", "steps"), DEPTH_CASES)
def test_compiled_blocks_share_their_graphs_whatever_the_depth(tokenizer, device, steps, request):
    """Under trims_hf's caches every compiled block runs the same graphs: a ten-block student decodes (prefix and dual
    cache, every step mode) on the graphs a one-block student compiled, committing its uncompiled tokens. A cache that
    names its layers by index alone (transformers' own) costs each block graphs of its own, past dynamo's default
    limit of 8: ``compile_blocks`` raises the limit, and every block still runs compiled. The graphs are dynamo's: on
    the CPU they are lowered without generated code; on CUDA by inductor, as the graph step captures them."""
    from torch._dynamo.utils import counters
    from transformers import DynamicCache

    if device == "cpu":
        request.getfixturevalue("compile_without_codegen")

    prompt = torch.tensor([[5, 40, 77, 90, 120, 31, 8]], device=device)
    configs = [DecodingConfig(gen_length=16, block_length=8, threshold=0.9, early_stop=False, step=step, cache=cache)
               for step in steps for cache in ("prefix", "dual")]
    shallow, deep, uncompiled = (tiny_student(tokenizer, layers=layers).to(device).eval() for layers in (1, 10, 10))
    torch._dynamo.reset()  # every graph is this test's own, counted
    counters.clear()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for config in configs:
            generate(shallow, prompt, config=replace(config, compile_blocks=True))
        graphs = counters["stats"]["unique_graphs"]
        for config in configs:
            compiled = generate(deep, prompt, config=replace(config, compile_blocks=True)).sequences
            assert torch.equal(compiled, generate(uncompiled, prompt, config=config).sequences), config
        assert counters["stats"]["unique_graphs"] == graphs > 0
        with torch.no_grad():
            deep(input_ids=prompt, cache=DynamicCache(config=deep.config), use_cache=True)
        assert counters["stats"]["unique_graphs"] - graphs >= 10
    assert counters["frames"]["total"] == counters["frames"]["ok"]


def assert_held_to_eager_bf16(compiled: torch.nn.Module, device: str, kind: str, dtype: torch.dtype) -> None:
    """The compiled bf16 student commits the fp32 decoder's tokens at every clear state, and its logits are no further
    from fp32's than twice the eager bf16 student's."""
    compile_blocks(compiled)
    fp32, eager = student(kind, device, torch.float32), student(kind, device, dtype)
    compared, mismatched = compare_where_margins_allow(fp32, compiled, device, kind)
    assert compared >= 2 and mismatched == 0  # 2 clear states of Dream's, 9 of LLaDA's on the CPU
    ids, mask = fixture_prompts(device, padded=True)
    with torch.no_grad():
        logits = {name: model(input_ids=ids, attention_mask=mask).logits.float()
                  for name, model in (("fp32", fp32), ("eager", eager), ("compiled", compiled))}
    assert (logits["compiled"] - logits["fp32"]).norm() <= 2 * (logits["eager"] - logits["fp32"]).norm()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (bench/gpu/run_all.sh runs these on a GPU)")
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_graph_replay_equals_eager_forward_bitwise(cache):
    """The decoder's own calls, a block's refresh then windows, with inputs changing between calls: a captured
    graph's logits equal the eager forward's bit for bit (same kernels), one graph per window length, and the
    key/value buffers stay where they were allocated."""
    model = student("llada", "cuda", torch.bfloat16)
    ids, mask = fixture_prompts("cuda", padded=True)
    length, block = ids.shape[1] + 32, 8
    x = torch.cat([ids, torch.full((ids.shape[0], 32), MASK_ID, device="cuda")], dim=1)
    full_mask = torch.cat([mask, torch.ones(ids.shape[0], 32, dtype=torch.long, device="cuda")], dim=1)
    positions = (full_mask.cumsum(1) - 1).clamp(min=0)
    spec = student_spec(model)
    forwards = {step: StudentForward(model, spec, cache, full_mask, positions, step=step) for step in ("eager", "graph")}
    generator = torch.Generator(device="cuda").manual_seed(0)
    pointers = set()
    with torch.no_grad():
        for start in range(ids.shape[1], length, block):
            for call in range(4):
                refresh = call == 0
                logits = {step: forward(x, start, start + block, refresh).clone() for step, forward in forwards.items()}
                assert torch.equal(logits["graph"], logits["eager"]), (start, call)
                x[:, start + call] = torch.randint(0, 250, (x.shape[0],), generator=generator, device="cuda")
                cache_layers = forwards["graph"].cache.layers if forwards["graph"].cache is not None else []
                pointers |= {layer.keys.data_ptr() for layer in cache_layers[:1]}
    captured = forwards["graph"].graphs.captured
    assert all(entry.graph is not None for entry in captured.values())
    assert len(captured) == len({length - start for start in range(ids.shape[1], length, block)} | {length}
                                if cache == "prefix" else {length, block} if cache == "dual" else {length})
    assert len(pointers) <= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (bench/gpu/run_all.sh runs these on a GPU)")
def test_compiled_blocks_keep_the_bf16_loss_and_gradients(tmp_path):
    """MDLMConfig(compile_blocks=True) changes kernels, not the objective. Under bf16 autocast (as Trainer.train runs)
    the compiled step's loss and LoRA gradients are measured against the fp32 eager step's: they may be no further
    from it than twice the eager bf16 step is (the fused kernels keep fp32 between ops where eager rounds to bf16, so
    they are often closer). Measured on an H100: the compiled and eager bf16 gradients differ by ~6% of their norm,
    both being bf16 approximations of the fp32 gradient. The CPU twin, in fp32 to float rounding, is in
    tests/test_trainer.py."""
    from trims_hf import MDLMConfig, MDLMTrainer

    rows = [{"input_ids": torch.randint(0, 250, (96,), generator=torch.Generator().manual_seed(i)).tolist(),
             "prompt_length": 16, "bucket_ids": [i % 8 for i in range(80)], "example_id": i} for i in range(4)]
    tokenizer = type("Tokenizer", (), {"eos_token_id": 254, "mask_token_id": 255})()
    batch = {key: value.cuda() for key, value in TrimsDataCollator(tokenizer)(rows).items()}
    results = {}
    for name, dtype, compiled in (("fp32", torch.float32, False), ("eager", torch.bfloat16, False),
                                  ("compiled", torch.bfloat16, True)):
        base = student("llada", "cuda", torch.float32)  # fp32 weights: bf16 is the autocast's, as in training
        torch.manual_seed(0)  # the same adapter initialisation every time
        model = get_peft_model(base, lora_config(base, lora_dropout=0.0))
        args = MDLMConfig(output_dir=str(tmp_path), bf16=dtype == torch.bfloat16, report_to="none",
                          compile_blocks=compiled)
        trainer = MDLMTrainer(model, args, data_collator=TrimsDataCollator(tokenizer))
        prepared = trainer.accelerator.prepare_model(model)
        loss = trainer.compute_loss(prepared, batch)
        loss.backward()
        grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.requires_grad])
        results[name] = (float(loss), grads)
    reference_loss, reference = results["fp32"]
    assert reference.norm() > 0
    eager_error = (results["eager"][1] - reference).norm()
    assert (results["compiled"][1] - reference).norm() <= 2 * eager_error
    assert abs(results["compiled"][0] - reference_loss) <= max(2 * abs(results["eager"][0] - reference_loss),
                                                               LOSS_TOLERANCE * reference_loss)
