"""What bench/real_size.py's parts share: the public configs, the models built from them, the goals, and the
measurement plumbing (:class:`Run`, peak memory, the out-of-memory batch search)."""

from __future__ import annotations

import gc
import json
import os
import platform
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from decode import CACHE_MODES  # noqa: E402
from scoring import reset_peak_rss, rss_kb  # noqa: E402

from trims_hf import prepare_student  # noqa: E402
from trims_hf.commands import ALLOCATOR_SETTINGS  # noqa: E402
from trims_hf.reports import library_versions  # noqa: E402
from trims_hf.students import STUDENTS  # noqa: E402

# --- public configs (bench/real_size.py's docstring gives the sources) --------------------------------------------------

LLADA_8B_INSTRUCT: dict[str, Any] = {
    "model_type": "llada", "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32, "mlp_hidden_size": 12288,
    "vocab_size": 126464, "embedding_size": 126464, "max_sequence_length": 4096, "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05, "weight_tying": False, "include_bias": False, "include_qkv_bias": False,
    "block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms", "alibi": False, "rope": True,
    "bias_for_layer_norm": False, "input_emb_norm": False, "attention_layer_norm": False, "scale_logits": False,
    "mask_token_id": 126336, "eos_token_id": 126081, "pad_token_id": 126081,
}
DREAM_V0_INSTRUCT_7B: dict[str, Any] = {
    "model_type": "Dream", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 131072,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "hidden_act": "silu",
    "use_sliding_window": False, "sliding_window": None, "rope_scaling": None,
    "mask_token_id": 151666, "bos_token_id": 151643, "eos_token_id": 151643, "pad_token_id": 151643,
}
QWEN3_8B: dict[str, Any] = {
    "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
    "attention_bias": False, "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645,
}
LLADA_MOE_7B_A1B_INSTRUCT: dict[str, Any] = {
    "model_type": "llada", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_key_value_heads": 16, "expert_intermediate_size": 1024, "dense_intermediate_size": 8192, "num_experts": 64,
    "num_experts_per_tok": 8, "moe_layer_freq": [1] * 16, "shared_expert_intermediate_size": None,
    "vocab_size": 157184, "max_position_embeddings": 8192, "rope_theta": 50000, "rms_norm_eps": 1e-5,
    "qk_layernorm": True, "partial_rotary_factor": 1, "moe_router_enable_expert_bias": False,
    "routed_scaling_factor": 1, "attention_bias": False, "tie_word_embeddings": False, "hidden_act": "silu",
    "norm_topk_prob": False, "eos_token_id": 156892, "pad_token_id": 156892, "mask_token_id": 156895,
}
LLADA2_MINI: dict[str, Any] = {
    "model_type": "llada2_moe", "hidden_size": 2048, "num_hidden_layers": 20, "first_k_dense_replace": 1,
    "intermediate_size": 5120, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
    "partial_rotary_factor": 0.5, "rotary_dim": 64, "num_experts": 256, "moe_intermediate_size": 512,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "num_shared_experts": 1, "routed_scaling_factor": 2.5,
    "moe_router_enable_expert_bias": True, "score_function": "sigmoid", "router_dtype": "fp32", "use_qk_norm": True,
    "use_qkv_bias": False, "use_bias": False, "norm_head": False, "vocab_size": 157184, "rope_theta": 600000,
    "rope_scaling": None, "rms_norm_eps": 1e-06, "max_position_embeddings": 16384, "tie_word_embeddings": False,
    "hidden_act": "silu", "use_sliding_window": False, "pad_token_id": 156892, "eos_token_id": 156892,
    "mask_token_id": 156895,
}
PUBLIC_CONFIGS = {"llada": LLADA_8B_INSTRUCT, "dream": DREAM_V0_INSTRUCT_7B, "llada_moe": LLADA_MOE_7B_A1B_INSTRUCT,
                  "llada2": LLADA2_MINI, "teacher": QWEN3_8B}
MODEL_NAMES = {"llada": "LLaDA-8B-Instruct", "dream": "Dream-v0-Instruct-7B", "llada_moe": "LLaDA-MoE-7B-A1B-Instruct",
               "llada2": "LLaDA2.0-mini", "teacher": "Qwen3-8B"}

# Tiny dimensions: same fields, same classes; vocab 512 with the special ids at its top.
TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    "llada": {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "mlp_hidden_size": 128, "vocab_size": 512,
              "embedding_size": 512, "mask_token_id": 511, "eos_token_id": 510, "pad_token_id": 510},
    "dream": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 4096,
              "mask_token_id": 511, "bos_token_id": 510, "eos_token_id": 510, "pad_token_id": 510},
    "llada_moe": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                  "expert_intermediate_size": 32, "dense_intermediate_size": 128, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_layer_freq": [1, 1], "vocab_size": 512, "max_position_embeddings": 4096,
                  "mask_token_id": 511, "eos_token_id": 510, "pad_token_id": 510},
    "llada2": {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "rotary_dim": 8, "num_experts": 8, "moe_intermediate_size": 32,
               "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "vocab_size": 512,
               "max_position_embeddings": 4096, "mask_token_id": 511, "eos_token_id": 510, "pad_token_id": 510},
    "teacher": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 4096,
                "bos_token_id": 510, "eos_token_id": 510},
}
TOKEN_ID_HIGH = 500
"""Synthetic token ids are drawn from [3, 500): below every model's special ids at both scales."""

# --- goals ----------------------------------------------------------------------------------------------------------


TRIMS_OVER_MDLM_MAX, TRAIN_MFU_MIN = 1.02, 0.40
RECIPE_MFU_MIN, RECIPE_MINUTES_MAX = 0.45, 40.0
SCORE_SECONDS_PER_MILLION_MAX = 60.0
FORWARD_OVER_BOUND_MAX, DUAL_SPEEDUP_MIN, BATCH_OVER_EAGER_MIN = 2.0, 1.5, 1.0
"""The goals: TRIMS steps <= 2% dearer than MDLM at >= 40% MFU; 1M teacher tokens in <= 1 minute; at batch
1 a dual-cache forward (the default step) within 2x the weight-read bound and dual cache >= 1.5x no cache in tokens/s;
at batch 16 the default step's dual-cache tokens/s at least the eager step's, measured in the same run; the LLaDA
recipe at >= 45% MFU with the whole s1K run (30 epochs) projected under 40 minutes on one H100."""


def shortfall(*factors: float | None) -> float | None:
    """How far a line is from its goals: the largest factor, each measured/limit for an upper bound or goal/measured
    for a lower one, so <= 1 means every goal met and 2 means twice off the worst one; None when one cannot be judged
    (an accelerator missing from the table)."""
    return None if any(f is None for f in factors) else max(factors)


def train_shortfall(trims_over_mdlm: float, mfu_value: float | None) -> float | None:
    return shortfall(trims_over_mdlm / TRIMS_OVER_MDLM_MAX, mfu_value and TRAIN_MFU_MIN / mfu_value)


def decode_shortfall(speedup: float, forward_ms: float, bound_ms: float | None) -> float | None:
    """Batch 1, dual cache: the forward against the weight-read bound and the speed-up over no cache."""
    return shortfall(DUAL_SPEEDUP_MIN / speedup, bound_ms and forward_ms / (FORWARD_OVER_BOUND_MAX * bound_ms))


def device_name(device: torch.device) -> str:
    """What every line names the hardware by: the CUDA device's name, or the CPU model and the threads used."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    return f"CPU: {model}, {os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads"


# --- models -----------------------------------------------------------------------------------------------------


def model_config(role: str, scale: str, attn_implementation: str | None = None) -> PreTrainedConfig:
    """The transformers config of ``role`` (llada, dream, teacher) at ``scale``; students through the library's
    own translation of their native config.json, as :func:`trims_hf.load_student` does."""
    raw = PUBLIC_CONFIGS[role] | (TINY_OVERRIDES[role] if scale == "tiny" else {})
    if role == "teacher":
        config = AutoConfig.for_model(**raw)
    else:
        config = STUDENTS[role].translate_config(raw)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    return config


def build_model(role: str, scale: str, device: torch.device | str, dtype: torch.dtype,
                attn_implementation: str | None = None) -> nn.Module:
    """A randomly initialised model created directly on ``device`` (``"meta"`` for shapes only); students prepared
    (bidirectional, mask id from the config) as ``load_student`` leaves them."""
    config = model_config(role, scale, attn_implementation)
    torch.manual_seed(0)
    own_class = None if role == "teacher" else STUDENTS[role].model_class  # LLaDA 2.x: its fused-QKV class
    with torch.device(device):
        if own_class is not None:
            model = own_class._from_config(config, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model if role == "teacher" else prepare_student(model, role)


def shape(config: PreTrainedConfig, parameters: int) -> dict[str, int]:
    """The dimensions a line reports, so a reader can check them against the public config."""
    heads = config.num_attention_heads
    return {"hidden": config.hidden_size, "layers": config.num_hidden_layers, "heads": heads,
            "kv_heads": config.num_key_value_heads,
            "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
            "intermediate": config.intermediate_size, "vocab": config.vocab_size, "parameters": parameters}


def linear_weights(model: nn.Module) -> int:
    """Parameters of the matmuls one token goes through (every nn.Linear, LM head included; the embedding lookup is no
    matmul; an MoE router's weight too); of a sparse MoE block's fused experts (3-D ``gate_up_proj`` / ``down_proj``),
    the ``num_experts_per_tok`` a token is routed to."""
    total = sum(module.weight.numel() for module in model.modules()
                if isinstance(module, nn.Linear) or type(module).__name__.endswith("Router"))  # MoE routers: a matmul
    routed = getattr(model.config.get_text_config(), "num_experts_per_tok", None)
    for module in model.modules():
        experts = [getattr(module, name, None) for name in ("gate_up_proj", "down_proj")]
        if routed and all(isinstance(w, nn.Parameter) and w.dim() == 3 for w in experts):
            total += sum(w.numel() // w.shape[0] * routed for w in experts)
    return total


def training_flops_per_token(config: PreTrainedConfig, sequence: int, frozen_matmul: int, lora: int,
                             views: int = 1) -> float:
    """Model FLOPs per trained token of a LoRA student (convention of the MFU we report).

    Frozen matmul weights cost 2 FLOPs per weight forward and 2 backward (activation gradients only, no weight
    gradients: 4N, not 6N); the LoRA weights 6 (forward, activation and weight gradients); bidirectional attention
    (QK^T and AV over the whole sequence, no causal halving) 4 * layers * sequence * heads * head_dim forward and
    twice that backward. Recomputation under gradient checkpointing is not counted (model, not hardware, FLOPs).
    ``views``: positions the forward runs per trained token, 2 for a block-diffusion student's [noised | clean]
    (every matmul twice, attention over twice the sequence for twice the queries; its mask is not subtracted).
    """
    s = shape(config, 0)
    attention = 3 * 4 * s["layers"] * views * sequence * s["heads"] * s["head_dim"]
    return views * (4.0 * frozen_matmul + 6.0 * lora + attention)


def flop_convention(views: int = 1) -> str:
    """How :func:`training_flops_per_token` counts, in a line's words."""
    return ("4N frozen + 6N LoRA + 12*layers*seq*heads*head_dim attention, the LM head at every position (MDLMTrainer "
            "runs it at the masked ones only); no recompute"
            + ("; all of it for the 2 x seq positions of block diffusion's [noised | clean]" if views == 2 else ""))


def head_flops_not_run(head_weights: int, views: int, masked_fraction: float) -> float:
    """Of :func:`training_flops_per_token`, the frozen LM head's FLOPs (4 per weight and position) at the positions
    MDLMTrainer never projects: all but the masked ``masked_fraction`` of one view's."""
    return 4.0 * head_weights * (views - masked_fraction)


# --- measurement plumbing ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """What every measurement line shares."""

    scale: str
    student: str
    """Student family of the train, zero2 and decode parts: llada (the goals are set for it), dream or llada_moe."""
    device: torch.device
    dtype: torch.dtype
    attn_implementation: str | None
    output: Path | None
    steps: int
    max_batch: int
    score_rows: int
    max_tokens_per_batch: int
    logits_chunk_elements: int
    score_budget_s: float
    cache_modes: tuple[str, ...] = CACHE_MODES
    """Cache modes the decode part times; "none" always among them (the reference of speed-ups and tokens)."""
    step_modes: tuple[str, ...] = ("eager", "static")
    """Step modes the decode part times (``DecodingConfig.step``); eager first (the reference of identical tokens),
    the library's default on the device last (the one judged)."""
    decode_batches: tuple[int, ...] | None = None
    """Batches the decode part times, 1 first; None: the scale's (``real_size_parts.decode.DECODE_BATCHES``)."""
    profile: Path | None = None
    """Where :func:`profiled` appends each part's torch.profiler table; lines measured under it say so."""
    train_variants: tuple[str, ...] = ("eager",)
    """:data:`TRAIN_VARIANTS` the train part measures, in order."""
    checkpointing: tuple[bool, ...] = (False, True)
    """Gradient-checkpointing settings the train part measures per variant."""
    train_profile: Path | None = None
    """Where the train part appends the summary of a profiled step (:func:`profile_steps`)."""

    def judge(self, short: float | None) -> dict[str, Any]:
        """A line's ``goal_shortfall`` (:func:`shortfall`) and ``goals_met``; both None at tiny scale, where the goals
        (set for real shapes on a GPU) do not apply, and where they cannot be judged."""
        if self.scale != "real" or short is None:
            return {"goal_shortfall": None, "goals_met": None}
        return {"goal_shortfall": round(short, 4), "goals_met": short <= 1}

    def emit(self, part: str, record: dict[str, Any]) -> dict[str, Any]:
        """Print (and append to ``--output``) one JSON line: ``record`` with the device, versions and settings."""
        line = {"bench": "real_size", "part": part, "scale": self.scale, "device": device_name(self.device),
                "device_type": self.device.type, "dtype": str(self.dtype).removeprefix("torch."),
                **record, "profiled": self.profile is not None,
                "cuda_alloc_conf": next((os.environ[name] for name in ALLOCATOR_SETTINGS if os.environ.get(name)), None),
                "versions": library_versions("accelerate", "deepspeed")}
        text = json.dumps(line)
        print(text, flush=True)
        if self.output is not None:
            with self.output.open("a") as handle:
                handle.write(text + "\n")
        return line


@contextmanager
def profiled(run: Run, part: str) -> Iterator[None]:
    """Run a part under torch.profiler when ``--profile`` is given and append its top operators (on CUDA by device
    time, then by host time: a launch-bound step shows there) to that file: what to read when a goal is missed. The
    timings of a profiled run are not benchmarks, and the parts do less under it (the profiler's record of a whole
    part takes longer to read than the part took)."""
    if run.profile is None:
        yield
        return
    cuda = run.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as profiler:
        yield
    averages = profiler.key_averages()
    with run.profile.open("a") as handle:
        for key in ("cuda_time_total", "self_cpu_time_total") if cuda else ("cpu_time_total",):
            table = averages.table(sort_by=key, row_limit=40)
            handle.write(f"== {part} ({run.scale}, {device_name(run.device)}), by {key} ==\n{table}\n")


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak for :func:`peak_memory`, so each measurement reports its own."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_rss()


def peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak since :func:`reset_peak_memory`: CUDA allocated bytes, or the process's peak resident memory on a CPU."""
    if device.type == "cuda":
        return {"peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
                "peak_memory_kind": "torch.cuda.max_memory_allocated"}
    return {"peak_memory_gib": round(rss_kb("VmHWM") / 2**20, 3), "peak_memory_kind": "process peak RSS (VmHWM)"}


def release(device: torch.device) -> None:
    """Give freed tensors back after an out-of-memory step, so the next (smaller) try starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def out_of_memory(error: BaseException) -> bool:
    """torch's OutOfMemoryError, or the RuntimeErrors CUDA and cuBLAS raise when an allocation fails inside them."""
    return isinstance(error, RuntimeError) and (isinstance(error, torch.OutOfMemoryError) or any(
        text in str(error) for text in ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED")))


def stepping_down(measure: Callable[[int], Any], size: int, recover: Callable[[], None]) -> tuple[int, Any]:
    """``(batch, measure(batch))`` for the largest batch <= ``size`` that runs: a batch that fit during the search can
    still run out of memory later (a mask draw hiding more tokens makes the loss gather more logits), so after each
    out-of-memory error ``recover`` frees memory and the measurement is retried one row smaller. ``recover`` runs
    after the ``except`` block: inside it the traceback still holds the failed step's activations."""
    while True:
        try:
            return size, measure(size)
        except RuntimeError as error:
            if not out_of_memory(error) or size == 1:
                raise
        recover()
        size -= 1


def largest_batch(fits: Callable[[int], bool], limit: int) -> int:
    """The largest batch in [1, limit] for which ``fits`` holds, assuming it holds up to some size and not beyond:
    doubling from 1 until a failure or ``limit``, then bisection between the last fit and the first failure.
    0 when even batch 1 does not fit."""
    if not fits(1):
        return 0
    good, bad = 1, None
    while bad is None and good < limit:
        candidate = min(2 * good, limit)
        if fits(candidate):
            good = candidate
        else:
            bad = candidate
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good

