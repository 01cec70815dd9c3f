"""bench/real_size.py's decode part: the student's decoding per batch, cache mode and step mode."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from decode import COMPILED, decode_modes, identical_fraction, step_settings
from torch import nn
from train_step import synchronize
from transformers import PreTrainedConfig

from real_size_parts.common import (
    BATCH_OVER_EAGER_MIN,
    DUAL_SPEEDUP_MIN,
    FORWARD_OVER_BOUND_MAX,
    MODEL_NAMES,
    TOKEN_ID_HIGH,
    Run,
    build_model,
    decode_shortfall,
    device_name,
    peak_memory,
    release,
    reset_peak_memory,
    shape,
)
from trims_hf import student_spec
from trims_hf.generation import BlockForward, DecodingConfig, StudentForward, generate
from trims_hf.generation.cache import CapturedCalls, uncapturable_experts
from trims_hf.studies.accelerators import accelerator, weight_read_bound_ms

DECODE_PROMPT_TOKENS = 128
DECODE_BATCHES = {"tiny": (1, 4), "real": (1, 16)}
"""The batches the decode part times per scale unless ``--decode-batches`` names others (:func:`parse_decode_batches`)."""
DECODE_GEN_LENGTH = {"tiny": 64, "real": 256}
"""Tiny scale decodes 2 blocks (enough for every cache mode to refresh once), the real one the paper's 256."""


def parse_decode_batches(text: str) -> tuple[int, ...]:
    """Comma-separated batch sizes, rising from 1: batch 1 is the reference of every row's tokens/s over batch 1 and
    the batch the static step, the compiled blocks and the forward's bound are judged at; ValueError otherwise."""
    parts = text.split(",")
    if not all(part.isascii() and part.isdigit() for part in parts):
        raise ValueError("whole numbers, comma-separated (e.g. 1 or 1,16)")
    batches = tuple(int(part) for part in parts)
    if batches[0] != 1 or any(a >= b for a, b in zip(batches, batches[1:])):
        raise ValueError("rising batch sizes starting at 1 (e.g. 1 or 1,16)")
    return batches


def without_graphs(step_modes: tuple[str, ...]) -> tuple[str, ...]:
    """``step_modes`` where no CUDA graph can be captured (a CPU, or experts no graph captures): the graph step left
    out, its compiled blocks timed under the static step instead."""
    return tuple(dict.fromkeys(mode.replace("graph", "static") if mode.endswith(COMPILED) else mode
                               for mode in step_modes if mode != "graph"))


def expert_modules(model: nn.Module) -> dict[str, nn.Module]:
    """A mixture-of-experts student's expert weights, by module name: transformers' fused experts (Qwen3-MoE's,
    GLM-4-MoE's), whose own parameters are 3-D with one slab per expert (``gate_up_proj``, ``down_proj``:
    ``[num_experts, ...]``). Empty for a dense student; the router (2-D) and a shared expert are dense weights."""
    found = {}
    for name, module in model.named_modules():
        own = list(module.parameters(recurse=False))
        count = getattr(module, "num_experts", None)
        if own and isinstance(count, int) and all(p.dim() == 3 and p.shape[0] == count for p in own):
            found[name] = module
    return found


def expert_bytes(experts: nn.Module) -> int:
    """Bytes of one expert's weights in an :func:`expert_modules` module."""
    return sum(p[0].numel() * p.element_size() for p in experts.parameters(recurse=False))


def weight_read_bytes(model: nn.Module, experts_reached: dict[str, float] | None = None) -> float:
    """Bytes a forward must read from memory at least once: every parameter but the input embedding table (of
    which only the looked-up rows are read). With ``experts_reached`` (per :func:`expert_modules` name, the experts a
    forward's tokens reach, :func:`routed_experts`), an MoE student's experts count only for those: the bound of the
    forward it actually runs, not of every expert it holds."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if head is None or head.weight is not embedding:  # a head tied to the table reads all of it
        total -= embedding.numel() * embedding.element_size()
    for name, experts in expert_modules(model).items() if experts_reached is not None else ():
        total -= (experts.num_experts - experts_reached[name]) * expert_bytes(experts)
    return total


@contextmanager
def routed_experts(model: nn.Module) -> Iterator[dict[str, float]]:
    """Fills the yielded dict, when the block ends, with the mean number of distinct experts each
    :func:`expert_modules` module was routed to per call made inside it (read from the routed indices, the experts'
    second argument, by a forward pre-hook): what a forward's tokens reach. Empty for a dense student. The hooks run
    in eager and static calls only (a CUDA graph replays without them), and they sync, so the calls they see are not
    the timed ones."""
    reached: dict[str, float] = {}
    counts: dict[str, list[int]] = {name: [] for name in expert_modules(model)}

    def hook(name: str) -> Callable[..., None]:
        def count(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
            routed = args[1] if len(args) > 1 else kwargs["top_k_index"]
            counts[name].append(int(routed.unique().numel()))
        return count

    handles = [module.register_forward_pre_hook(hook(name), with_kwargs=True)
               for name, module in expert_modules(model).items()]
    try:
        yield reached
    finally:
        for handle in handles:
            handle.remove()
        reached |= {name: statistics.mean(seen) for name, seen in counts.items() if seen}


@dataclass
class CallTimes:
    """Per decoder model call (:class:`trims_hf.generation.StudentForward`, whatever runs it: an eager forward or a
    graph replay): the device's time between CUDA events around it (GPU idle gaps while the host launches included,
    so a host-bound call shows its true cost), and the host's time to issue it (the wall clock, no sync). On a CPU
    both are the wall clock. ``replayed`` says, per call, whether it replayed a captured graph: under the graph step a
    shape's first call runs eagerly and its second warms up and captures (:class:`CapturedCalls`, once per decode),
    which the mean over every call pays, as a user's decode does, and the replays' mean leaves out."""

    device_s: list[Callable[[], float]]
    host_s: list[float]
    replayed: list[bool] = field(default_factory=list)

    def summary(self) -> dict[str, float | int | None]:
        device = [read() for read in self.device_s]
        replays = [seconds for seconds, replay in zip(device, self.replayed) if replay]
        return {"forward_ms": statistics.mean(device) * 1e3, "host_ms_per_forward": statistics.mean(self.host_s) * 1e3,
                "forward_calls": len(self.host_s), "replayed_calls": len(replays),
                "replay_forward_ms": statistics.mean(replays) * 1e3 if replays else None}


@contextmanager
def forward_times(device: torch.device, model: nn.Module) -> Iterator[CallTimes]:
    """Times every decoder model call made inside the block (:class:`CallTimes`); no sampling, strategy or hooks. The
    calls are :class:`StudentForward`'s, or, for a block-diffusion student, :class:`BlockForward`'s (a replayed graph
    included)."""
    cuda = device.type == "cuda"
    times = CallTimes([], [])
    owner = BlockForward if student_spec(model).block_size is not None else StudentForward
    name = "__call__"
    call, capture = getattr(owner, name), CapturedCalls.__call__
    replays: list[bool] = []  # per CapturedCalls call inside the timed one

    def captured(self: CapturedCalls, key: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        entry = self.captured.get(key)
        replays.append(entry is not None and entry.graph is not None)
        return capture(self, key, *args, **kwargs)

    def timed(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        replays.clear()
        begin_host = time.perf_counter()
        begin = torch.cuda.Event(enable_timing=True) if cuda else None
        if cuda:
            begin.record()
        logits = call(self, *args, **kwargs)
        end_host = time.perf_counter()
        times.replayed.append(bool(replays) and all(replays))
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            times.device_s.append(lambda: begin.elapsed_time(end) / 1e3)
        else:
            times.device_s.append(lambda: end_host - begin_host)
        times.host_s.append(end_host - begin_host)
        return logits

    setattr(owner, name, timed)
    CapturedCalls.__call__ = captured
    try:
        yield times
    finally:
        setattr(owner, name, call)
        CapturedCalls.__call__ = capture
        synchronize(device)


def padded_prompts(batch: int, longest: int, pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` prompts of different lengths (the first ``longest``, the others half to all of it), LEFT-padded with
    their attention mask, as ``generate_text`` (the evaluation) sends them."""
    generator = torch.Generator().manual_seed(batch)
    lengths = [longest] + torch.randint(longest // 2, longest + 1, (batch - 1,), generator=generator).tolist()
    ids = torch.full((batch, longest), pad_id)
    mask = torch.zeros(batch, longest, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, longest - length:] = torch.randint(3, TOKEN_ID_HIGH, (length,), generator=generator)
        mask[row, longest - length:] = 1
    return ids.to(device), mask.to(device)


def uncompile(model: nn.Module) -> None:
    """Every module compiled in place (``DecodingConfig.compile_blocks``) runs eagerly again."""
    for module in model.modules():
        module._compiled_call_impl = None


def compiled_graphs() -> int:
    """The graphs dynamo has compiled in this process: a compiled row's difference says how many it needed (0 where
    the rows before it compiled them all)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def failed(run: Run, batch: int, mode: str, step: str, error: Exception, **note: str) -> None:
    """One mode failing on the device must not cost the others' lines: an error line in its place."""
    run.emit("decode", {"measurement": "decode", "model": MODEL_NAMES[run.student], "batch": batch, "cache": mode,
                        **step_settings(step), **note, "error": f"{type(error).__name__}: {error}"[:2000]})
    release(run.device)


def decode_part(run: Run) -> None:
    """Per batch, cache mode and step mode: the decoder's model calls alone (:func:`forward_times`) next to the
    weight-read bound, the whole decoding's wall time per call, tokens/s and peak memory; prompts left-padded with
    their mask. The static step and the compiled blocks (step labels ``...+compiled``, after the plain ones, each
    timed after an untimed decode that compiles) are measured at batch 1 only, where host time decides (at batch 16
    the static step is eager's kernels without the launches' cost, which graph also removes). An MoE student's bound
    counts the experts its forwards reach (:func:`routed_experts`, over an untimed eager decode of the same prompts
    per cache mode, whose tokens every step's are checked against). Then SDPA alone under the padded batch's mask
    forms (:func:`mask_forms`)."""
    model = build_model(run.student, run.scale, run.device, run.dtype, run.attn_implementation).eval()
    graphs = any(step.startswith("graph") for step in run.step_modes)  # real_size.py leaves them out on a CPU
    if graphs and (uncapturable := uncapturable_experts(model, run.device)) is not None:
        run = replace(run, step_modes=without_graphs(run.step_modes))  # resolve_step would refuse them
        run.emit("decode", {"measurement": "decode", "model": MODEL_NAMES[run.student], "step": "graph",
                            "skipped": f"no CUDA graph captures this student here ({uncapturable}): the decode part "
                                       f"times {','.join(run.step_modes)}; the static step at batch 1 only, so no "
                                       "larger batch's goal is judged"})
    peak = accelerator(device_name(run.device))
    all_weight_bytes = weight_read_bytes(model)
    moe = bool(expert_modules(model))
    judged_step = [step for step in run.step_modes if not step.endswith(COMPILED)][-1]
    gen_length = 2 * 32 if run.profile else DECODE_GEN_LENGTH[run.scale]  # profiled: two blocks, one refresh
    base = DecodingConfig(gen_length=gen_length, block_length=32, threshold=0.9, early_stop=False)
    pad_id = model.config.pad_token_id
    batches = (run.decode_batches or DECODE_BATCHES[run.scale])[:1 if run.profile else None]
    fitted = []  # the batches whose prompts fit in memory
    single: dict[tuple[str, str], float] = {}
    """Tokens/s of each (cache, step) at batch 1 (the first batch), the reference of the batch goal."""

    def emit_group(batch: int, prompts: tuple[torch.Tensor, torch.Tensor], group: tuple[str, ...], results: dict,
                   calls: dict, memory: dict, reached: dict, compilation: dict) -> None:
        """The rows of one group of steps at ``batch``, as soon as it is timed: a call stopped inside the compiled
        group keeps the others'."""
        per_second = {key: summary["tokens_per_second"] for key, (summary, _) in results.items()}
        if batch == batches[0]:
            single.update(per_second)
        for (mode, step), (summary, responses) in results.items():
            if step not in group or ("none", step) not in results or (mode, step) not in single:
                continue  # its reference failed: the error line says why
            timing = calls[mode, step]
            forward_ms = timing["forward_ms"]
            weight_bytes = weight_read_bytes(model, reached[mode] if moe else None)
            bound_ms = weight_read_bound_ms(weight_bytes, peak)
            speedup = per_second[mode, step] / per_second["none", step]
            over_single = per_second[mode, step] / single[mode, step]
            judged = None
            if mode == "dual" and step in (judged_step, judged_step + COMPILED):  # the default step (graph on
                # CUDA), its blocks compiled or not
                judged = (decode_shortfall(speedup, forward_ms, bound_ms) if batch == 1
                          else BATCH_OVER_EAGER_MIN * per_second["dual", "eager"] / per_second[mode, step])
            graph_memory = None
            if step == "graph" and (mode, "static") in memory:
                graph_memory = round(memory[mode, "graph"]["peak_memory_gib"]
                                     - memory[mode, "static"]["peak_memory_gib"], 3)
            run.emit("decode", {
                "measurement": "decode", "model": MODEL_NAMES[run.student],
                "shape": shape(model.config, model.num_parameters()),
                "attn_implementation": model.config._attn_implementation, "batch": batch,
                "prompt_tokens": prompts[1].sum(1).tolist(), "left_padded_with_mask": True,
                "gen_length": base.gen_length, "block_length": base.block_length,
                "threshold": base.threshold, "early_stop": False, "cache": mode, **step_settings(step),
                "nfe": summary["nfe"], "model_forwards": summary["model_forwards"],
                "tokens_per_step": round(summary["tokens_per_step"], 3),
                "wall_time_s": round(summary["wall_time_s"], 6),
                "wall_ms_per_model_forward": round(summary["wall_time_s"] * 1e3 / summary["model_forwards"], 3),
                "forward_ms": round(forward_ms, 3), "host_ms_per_forward": round(timing["host_ms_per_forward"], 3),
                "forward_calls": timing["forward_calls"], "replayed_calls": timing["replayed_calls"],
                "forward_timing": "CUDA events around each decoder model call (eager forward or graph replay; under "
                "the graph step each shape's first call and its capture count too, as in a user's decode: "
                "replay_forward_ms leaves them out); host_ms: the host's time to issue it" if run.device.type == "cuda"
                else "wall clock around each decoder model call",
                "replay_forward_ms": None if timing["replay_forward_ms"] is None
                else round(timing["replay_forward_ms"], 3),
                "tokens_per_s": round(per_second[mode, step], 1), "speedup_over_no_cache": round(speedup, 3),
                "identical_tokens_vs_no_cache": round(identical_fraction(responses, results["none", step][1]), 4),
                "identical_tokens_vs_eager": identical_fraction(responses, results[mode, "eager"][1])
                if (mode, "eager") in results else None,
                **memory[mode, step], "graph_memory_gib": graph_memory,
                "compiled_graphs": compilation.get((mode, step)),
                "weight_read_bytes": round(weight_bytes), "weight_read_bytes_all_experts": all_weight_bytes,
                "experts_reached": {name.removeprefix("model."): round(count, 2)
                                    for name, count in reached[mode].items()} if moe else None,
                "accelerator": peak.name if peak else None,
                "bandwidth_tb_s": peak.bandwidth_tb_s if peak else None,
                "weight_read_bound_ms": round(bound_ms, 3) if bound_ms else None,
                "forward_over_bound": round(forward_ms / bound_ms, 3) if bound_ms else None,
                "replay_forward_over_bound": round(timing["replay_forward_ms"] / bound_ms, 3)
                if bound_ms and timing["replay_forward_ms"] is not None else None,
                "tokens_per_s_over_batch_1": round(over_single, 3),
                "goals": {"batch1_dual_forward_over_bound_max": FORWARD_OVER_BOUND_MAX,
                          "batch1_dual_speedup_over_no_cache_min": DUAL_SPEEDUP_MIN,
                          **({f"batch{batches[-1]}_dual_tokens_per_s_over_eager_min": BATCH_OVER_EAGER_MIN}
                             if batches[-1] > 1 else {}),  # no larger batch timed: its goal is not judged
                          "judged_on": f"dual cache, step {judged_step} (blocks compiled or not)"},
                **run.judge(judged),
                "note": "random weights: about one token committed per step, so every mode does the same steps"
                + ("; compiled blocks round differently from eager kernels, and with random weights each commit is a "
                   "near-tie, so their tokens may part from eager's (the CUDA tests hold fp32 compiled blocks "
                   "to eager's tokens on the fixture students, bf16 ones to eager bf16's margins and logit "
                   "distance)" if step.endswith(COMPILED) else ""),
            })

    with torch.inference_mode():
        warm = padded_prompts(1, DECODE_PROMPT_TOKENS, pad_id, run.device)
        for mode in run.cache_modes:  # warm-up: kernels and allocator, one block per mode
            generate(model, *warm, config=replace(base, gen_length=base.block_length, cache=mode, step="eager"))
        for batch in batches:
            try:
                prompts = padded_prompts(batch, DECODE_PROMPT_TOKENS, pad_id, run.device)
            except RuntimeError as error:  # a batch too large for the device's (or the host's) memory
                failed(run, batch, "all", "all", error, skipped="its prompts do not fit in memory")
                continue
            fitted.append(batch)
            steps = tuple(step for step in run.step_modes
                          if batch == batches[0] or (step != "static" and not step.endswith(COMPILED)))
            results, calls, memory, reached, compilation = {}, {}, {}, {}, {}
            groups = (tuple(s for s in steps if not s.endswith(COMPILED)), tuple(s for s in steps if s.endswith(COMPILED)))
            for compiled, group in enumerate(groups):
                for mode in run.cache_modes:  # the compiled blocks last: they stay compiled until uncompile
                    if moe and not compiled:
                        try:
                            with routed_experts(model) as reached[mode]:
                                decode_modes(model, [prompts], base, (mode,), ("eager",))
                        except RuntimeError as error:
                            reached.pop(mode, None)
                            failed(run, batch, mode, "eager", error, skipped="the routing decode failed: without the experts it "
                                   "reaches there is no bound, so no step of this cache mode is timed")
                            continue
                    if moe and mode not in reached:
                        continue
                    for step in group:
                        reset_peak_memory(run.device)
                        graphs = compiled_graphs()
                        try:
                            # Blocks past dynamo's recompile limit would run eagerly, timed under the compiled step's
                            # name: there a compiled step raises instead (an error row).
                            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=bool(compiled)):
                                if compiled:  # compiles, captures: what the timed decode reuses
                                    decode_modes(model, [prompts], base, (mode,), (step,))
                                with forward_times(run.device, model) as times:
                                    results |= decode_modes(model, [prompts], base, (mode,), (step,))
                        except (RuntimeError, torch._dynamo.exc.FailOnRecompileLimitHit) as error:
                            failed(run, batch, mode, step, error)
                            continue
                        calls[mode, step], memory[mode, step] = times.summary(), peak_memory(run.device)
                        if compiled:
                            compilation[mode, step] = compiled_graphs() - graphs
                emit_group(batch, prompts, group, results, calls, memory, reached, compilation)
            uncompile(model)
        if fitted:
            mask_forms(run, model.config, fitted[-1], DECODE_PROMPT_TOKENS + gen_length, base.block_length)


def mask_forms(run: Run, config: PreTrainedConfig, batch: int, length: int, window: int) -> None:
    """SDPA alone at the padded batch's dual-cache shape (``window`` queries against ``length`` keys, the student's
    heads): no mask (the reference, not valid for padded rows), a boolean mask and an additive mask in the model's
    dtype, both [B, 1, 1, L] as the static step builds them: which form the device runs fastest."""
    s = shape(config, 0)
    generator = torch.Generator(device=run.device).manual_seed(0)

    def tensor(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator, device=run.device, dtype=run.dtype)

    query, key, value = tensor(batch, s["heads"], window, s["head_dim"]), *(
        tensor(batch, s["heads"], length, s["head_dim"]) for _ in range(2))
    keep = torch.arange(length, device=run.device)[None] >= torch.arange(batch, device=run.device)[:, None] * 4
    forms = {"none": None, "bool": keep[:, None, None, :],
             "additive": torch.zeros(keep.shape, dtype=run.dtype, device=run.device).masked_fill(
                 ~keep, torch.finfo(run.dtype).min)[:, None, None, :]}
    repeats = 200 if run.device.type == "cuda" else 5
    timings = {}
    with torch.inference_mode():
        for name, mask in forms.items():
            for _ in range(3):
                torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
            synchronize(run.device)
            began = time.perf_counter()
            for _ in range(repeats):
                torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
            synchronize(run.device)
            timings[name] = (time.perf_counter() - began) / repeats * 1e6
    masked = {name: timings[name] for name in ("bool", "additive")}
    run.emit("decode", {"measurement": "attention_mask_form", "model": MODEL_NAMES[run.student], "batch": batch,
                        "queries": window, "keys": length, "heads": s["heads"], "head_dim": s["head_dim"],
                        "us_per_call": {name: round(value, 2) for name, value in timings.items()},
                        "fastest_mask_form": min(masked, key=masked.get),
                        "note": "SDPA's own dispatch per form; 'none' is the unpadded reference"})


