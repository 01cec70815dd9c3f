"""The paper's models at their true shapes: training, teacher scoring and decoding; one JSON line per measurement.

``--scale real`` builds randomly initialised models in the exact shapes of the public config.json files, directly
on ``--device`` in ``--dtype`` (no CPU init); ``--scale tiny`` builds the same architecture classes through the
same code paths with tiny dimensions, so the whole script runs on a CPU in seconds (the test suite does that).
Student shapes go through the library's own config translation (``llama_config_from_llada``,
``qwen2_config_from_dream``) from dicts mirroring the public config.json; attention is whatever transformers
picks on the device (SDPA on CUDA unless ``--attn-implementation`` says otherwise), recorded in every line.

Parts (each sized to finish within a 10-minute command on one H100):

- ``train``: LoRA r=32 / alpha=32 student (all attention and MLP projections, ``trims_hf.lora_config``) at sequence
  length 1024 through MDLMTrainer, its model prepared by the Trainer's accelerator as ``Trainer.train`` does (bf16
  autocast, fp32 outputs, gradient clipping): per-device batch 1 and the largest batch that fits (searched: doubling,
  then bisection, an out-of-memory step counts as "does not fit"), with and without gradient checkpointing; TRIMS
  (trajectory ratio 0.1) and MDLM (ratio 0) steps interleaved on the same model, their step-time ratio, tokens/s
  (padded and real), peak memory and model FLOPs utilisation (:func:`training_flops_per_token` states the convention).
- ``zero2``: one DeepSpeed ZeRO-2 training run of a few steps through the shipped ``recipes/accelerate/zero2.yaml``
  (and the zero2.json it names), launched with ``accelerate launch --num_processes 1``.
- ``score``: the Qwen3-8B-shaped teacher over ``--score-rows`` rows of s1K-like lengths (:func:`s1k_like_lengths`)
  with the library's planner and scorer, until ``--score-budget-s``: tokens/s, peak memory, extrapolated s1K curation
  time, the 1M-tokens goal.
- ``decode``: the LLaDA-8B-shaped student, gen 256, block 32, threshold 0.9, batch 1 and 16 (left-padded prompts of
  different lengths with their mask), no / prefix / dual cache: model forward time (CUDA events), wall time per model
  call, tokens/s, NFE, tokens identical to no cache, and the weight-read bound (weight bytes / memory bandwidth).

Public configs (verified with the search tool on 2026-11-26; the Hub itself is unreachable here):
- LLaDA-8B-Instruct: a copy of its config.json in github.com/yinj66/support_basis
  ("LLaDA-8B-Instruct-B&S-light/config.json"): d_model 4096, n_layers 32, n_heads = n_kv_heads 32,
  mlp_hidden_size 12288, vocab_size = embedding_size 126464, max_sequence_length 4096, rope_theta 500000,
  rms_norm_eps 1e-5, weight_tying false, no biases, mask 126336, eos = pad 126081.
- Dream-v0-Instruct-7B: its own config.json is not in the index; the same DreamModel config of
  apple/DiffuCoder-7B-Instruct (huggingface.co/apple/DiffuCoder-7B-Instruct/resolve/main/config.json, also
  Qwen2.5-7B-based) and Qwen2.5-7B's config give: hidden 3584, 28 layers, 28 heads / 4 KV (head_dim 128),
  intermediate 18944, vocab 152064, max_position_embeddings 131072, rope_theta 1e6, rms_norm_eps 1e-6,
  tie_word_embeddings false, mask 151666, bos = eos = pad 151643 (as ../shared/fixtures/README.md lists for 7B).
- LLaDA-MoE-7B-A1B-Instruct (``--student llada_moe``): its Hub config.json as a third-party guide quotes it (found with
  the search tool's find_string/read_file, consistent with a vLLM plugin's docs; not byte-verified): hidden 2048,
  16 layers, 16 heads / 16 KV, 64 experts of 1,024, 8 routed per token, every layer sparse, vocab 157184, rope_theta
  50000, q/k norms; the mask id 156895 is not in it (the port's default). The experts are fused 3-D weights, so
  :func:`linear_weights` counts the 8 routed experts per token, not all 64; the weight-read bound counts all 64.
- LLaDA2.0-mini (``--student llada2``): dFactory's copy of its config.json (github.com/inclusionAI/dFactory,
  ``configs/model_configs/llada2_mini/config.json`` at 92b6890; its ``model_type`` there is the VeOmni build's
  ``llada2_moe_veomni``, the Hub's ``llada2_moe``): hidden 2048, 20 layers (the first dense, intermediate 5120),
  16 heads / 4 KV, head_dim 128, partial_rotary_factor 0.5, 256 experts of 512, 8 routed per token (8 groups, best 4),
  one shared expert, routed_scaling_factor 2.5, expert bias, vocab 157184, rope_theta 600000, rms_norm_eps 1e-6,
  max_position_embeddings 16384; mask 156895 (dFactory's ``train_llada2_bd.py``), EOS = pad 156892. dFactory's
  README lists it as 16B; the model card's "16B total / 1.4B active" is not re-readable here, but these shapes give
  16.3B parameters. It is a block-diffusion student: the train part runs its [noised | clean] forward (twice the
  sequence), the decode part its block-causal decoder (cache none and its exact prefix cache, step eager).
- Qwen3-8B: "Copy config.json from Qwen/Qwen3-8B" (huggingface.co/thejaminator/qwen-hook-layer-9, commit
  478fb72): hidden 4096, 36 layers, 32 heads / 8 KV, head_dim 128, intermediate 12288, vocab 151936,
  max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-6, tie_word_embeddings false, no attention bias.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from peft import get_peft_model
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig, TrainerCallback

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import train_profile  # noqa: E402
from collator import prepared_rows  # noqa: E402
from decode import CACHE_MODES, decode_modes, identical_fraction  # noqa: E402
from scoring import reset_peak_rss, rss_kb  # noqa: E402
from train_step import build_trainer, interleaved_steps, masking_collators, precision_path, step, synchronize  # noqa: E402

from trims_hf import TrimsDataCollator, lora_config, mask_token_id, prepare_student, student_spec  # noqa: E402
from trims_hf.data.scoring import EncodedRow, plan_batches  # noqa: E402
from trims_hf.data.teacher import check_chunked_head, score_rows  # noqa: E402
from trims_hf.generation import DecodingConfig, StudentForward, generate  # noqa: E402
from trims_hf.reports import library_versions  # noqa: E402
from trims_hf.settings import ScoringOptions  # noqa: E402
from trims_hf.students import STUDENTS  # noqa: E402

# --- public configs (see the module docstring for the sources) --------------------------------------------------

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

# --- accelerators: the library's one table of peaks ----------------------------------------------------------------
from trims_hf.studies.accelerators import accelerator, mfu, weight_read_bound_ms  # noqa: E402

TRIMS_OVER_MDLM_MAX, TRAIN_MFU_MIN = 1.02, 0.40
SCORE_SECONDS_PER_MILLION_MAX = 60.0
FORWARD_OVER_BOUND_MAX, DUAL_SPEEDUP_MIN, BATCH_OVER_EAGER_MIN = 2.0, 1.5, 1.0
"""The goals: TRIMS steps <= 2% dearer than MDLM at >= 40% MFU; 1M teacher tokens in <= 1 minute; at batch
1 a dual-cache forward (the default step) within 2x the weight-read bound and dual cache >= 1.5x no cache in tokens/s;
at batch 16 the default step's dual-cache tokens/s at least the eager step's, measured in the same run."""


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
                "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
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


# --- part 1: training --------------------------------------------------------------------------------------------

SEQUENCE_LENGTH = {"tiny": 256, "real": 1024}
PROMPT_TOKENS = 64


def training_rows(run: Run, count: int, seed: int = 0) -> list[dict]:
    """Prepared rows of half to all of the sequence length (prompt 64, random buckets); batches are padded to the
    sequence length with EOS, as the recipes' ``padding: max_length`` does, so every trained row has that length."""
    return prepared_rows(count, SEQUENCE_LENGTH[run.scale], PROMPT_TOKENS, seed=seed, high=TOKEN_ID_HIGH)


@dataclass(frozen=True)
class LoraStudent:
    model: nn.Module
    base_parameters: int
    frozen_matmul: int
    """Weights of the base model's matmuls (:func:`linear_weights`)."""
    lora_parameters: int


def lora_student(run: Run, role: str, lora_dropout: float | None = None) -> LoraStudent:
    """The student wrapped with the paper's LoRA (r=32, alpha=32 on every attention and MLP projection), with the
    library's LoRA dropout unless ``lora_dropout`` says otherwise."""
    model = build_model(role, run.scale, run.device, run.dtype, run.attn_implementation)
    base, frozen = model.num_parameters(), linear_weights(model)
    extra = {} if lora_dropout is None else {"lora_dropout": lora_dropout}
    model = get_peft_model(model, lora_config(model, **extra))
    return LoraStudent(model, base, frozen, sum(p.numel() for p in model.parameters() if p.requires_grad))


TRAIN_VARIANTS: dict[str, dict[str, Any]] = {
    "eager": {},
    "compiled": {"compile_blocks": True},
    "no_dropout": {"lora_dropout": 0.0},
}
"""What the train part can compare, each on a fresh student: today's step; ``MDLMConfig(compile_blocks=True)``; LoRA
without dropout (peft then skips the per-adapter dropout copies of each projection's input)."""
PROFILED_STEPS = 3


def student_collators(run: Run, model: nn.Module) -> dict[str, TrimsDataCollator]:
    """TRIMS and MDLM collators padding to the sequence length; the student's own EOS and mask ids."""
    eos = SimpleNamespace(eos_token_id=model.get_base_model().config.eos_token_id)
    return masking_collators(eos, SEQUENCE_LENGTH[run.scale], mask_token_id(model), padding="max_length")


def trainer_settings(run: Run, **extra: Any) -> dict[str, Any]:
    return {"use_cpu": run.device.type == "cpu", "bf16": run.dtype == torch.bfloat16 and run.device.type == "cuda",
            "max_length": SEQUENCE_LENGTH[run.scale], "padding": "max_length", **extra}


def train_part(run: Run) -> None:
    """Per variant (:data:`TRAIN_VARIANTS`), each on a fresh student: per gradient-checkpointing setting, the batch
    search, then batch 1 and the largest batch measured; the first variant's largest batch without checkpointing is
    then profiled into ``--train-profile`` (:mod:`train_profile`)."""
    for index, variant in enumerate(run.train_variants):
        train_variant(run, variant, profile=index == 0 and run.train_profile is not None)
        release(run.device)


def train_variant(run: Run, variant: str, profile: bool) -> None:
    settings = dict(TRAIN_VARIANTS[variant])
    student = lora_student(run, run.student, settings.pop("lora_dropout", None))
    model, lora = student.model, student.lora_parameters
    config = model.get_base_model().config
    peak = accelerator(device_name(run.device))
    length = SEQUENCE_LENGTH[run.scale]
    views = 1 if STUDENTS[run.student].block_size is None else 2  # block diffusion: [noised | clean]
    flops = training_flops_per_token(config, length, student.frozen_matmul, lora, views)
    collators = student_collators(run, model)
    rows = training_rows(run, run.max_batch * run.steps)

    def batches(size: int) -> list[list[dict]]:
        return [rows[i * size:(i + 1) * size] for i in range(run.steps)]

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(model, collators["trims"], tmp, **trainer_settings(run, **settings))

        def recover() -> None:
            trainer.optimizer.zero_grad(set_to_none=True)
            release(run.device)

        def fits(size: int) -> bool:
            try:
                step(trainer, collators["trims"], rows[:size])
                return True
            except RuntimeError as error:
                if not out_of_memory(error):
                    raise
            recover()  # after the except block, whose traceback holds the failed step's activations
            return False

        def measure(size: int) -> dict[str, list[float]]:
            reset_peak_memory(run.device)
            return interleaved_steps(trainer, collators, batches(size))

        precision = precision_path(trainer)
        for checkpointing in run.checkpointing:
            if checkpointing:
                trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            largest = largest_batch(fits, run.max_batch)
            if largest == 0:
                run.emit("train", {"measurement": "lora_training_step", "model": MODEL_NAMES[run.student],
                                   "sequence_length": length, "gradient_checkpointing": checkpointing,
                                   "largest_fitting_batch": 0, "note": "per-device batch 1 runs out of memory"})
                continue
            for searched in sorted({1, largest}):
                size, times = stepping_down(measure, searched, recover)
                medians = {name: statistics.median(values) for name, values in times.items()}
                tokens_per_s = size * length / medians["trims"]
                real_tokens = statistics.mean(sum(min(len(row["input_ids"]), length) for row in batch)
                                              for batch in batches(size))
                ratio = medians["trims"] / medians["mdlm"]
                run.emit("train", {
                    "measurement": "lora_training_step", "model": MODEL_NAMES[run.student], "variant": variant,
                    "variant_settings": TRAIN_VARIANTS[variant],
                    "shape": shape(config, student.base_parameters),
                    "attn_implementation": config._attn_implementation, "lora": {"r": 32, "alpha": 32, "parameters": lora},
                    "sequence_length": length, "per_device_batch": size, "largest_fitting_batch": largest,
                    "batch_search_limit": run.max_batch, "gradient_checkpointing": checkpointing, "steps_each": run.steps,
                    "trims_median_step_s": round(medians["trims"], 6), "mdlm_median_step_s": round(medians["mdlm"], 6),
                    "trims_over_mdlm": round(ratio, 4), "goal_trims_over_mdlm_max": TRIMS_OVER_MDLM_MAX,
                    "tokens_per_s": round(tokens_per_s, 1), "real_tokens_per_s": round(real_tokens / medians["trims"], 1),
                    "tokens_counted": "tokens_per_s (the goal's): every position of the 1,024-token rows, EOS padding "
                                      "included (computed and trained under the recipes' padding: max_length); "
                                      "real_tokens_per_s: the rows' own tokens only",
                    "goal_mfu_min": TRAIN_MFU_MIN, "precision": precision,
                    **peak_memory(run.device), "flops_per_token": flops,
                    "flop_convention": "4N frozen + 6N LoRA + 12*layers*seq*heads*head_dim attention, the LM head at "
                                       "every position (MDLMTrainer runs it at the masked ones only); no recompute"
                                       + ("; all of it for the 2 x seq positions of block diffusion's [noised | clean]"
                                          if views == 2 else ""),
                    "forward_positions_per_token": views,
                    "mfu": round(mfu(flops, tokens_per_s, peak), 4) if peak else None,
                    "accelerator": peak.name if peak else None, "peak_bf16_tflops": peak.bf16_tflops if peak else None,
                    **run.judge(train_shortfall(ratio, mfu(flops, tokens_per_s, peak))),
                })
            if profile and not checkpointing:  # at the largest batch measured (after any late step-down)
                profile_steps(run, trainer, collators["trims"], batches(size)[0], config.vocab_size, variant)


def profile_steps(run: Run, trainer: Any, collator: TrimsDataCollator, rows: list[dict], vocab: int,
                  variant: str) -> None:
    """:data:`PROFILED_STEPS` optimizer steps on ``rows`` under torch.profiler (one warm-up step first), summarised
    by :func:`train_profile.summarise` and appended to ``--train-profile``."""
    title = (f"train ({run.scale}, {device_name(run.device)}): {MODEL_NAMES[run.student]}, variant {variant}, "
             f"batch {len(rows)} x {SEQUENCE_LENGTH[run.scale]}, LoRA r=32, {str(run.dtype).removeprefix('torch.')}")
    cuda = run.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    try:
        step(trainer, collator, rows)
        with torch.profiler.profile(activities=activities, record_shapes=True) as profiler:
            began = time.perf_counter()
            for _ in range(PROFILED_STEPS):
                step(trainer, collator, rows)
            wall = time.perf_counter() - began
    except RuntimeError as error:
        if not out_of_memory(error):
            raise
        summary = f"== {title} ==\nnot profiled: out of memory under the profiler ({error})\n"
    else:
        summary = train_profile.summarise(profiler.events(), PROFILED_STEPS, vocab, 32, wall, title)
    with run.train_profile.open("a") as handle:
        handle.write(summary)


# --- part 1b: one DeepSpeed ZeRO-2 run through the shipped recipe ------------------------------------------------

ZERO2_STEPS = 3


class _StepTimer(TrainerCallback):
    """Wall time of every optimizer step (synchronised), so the first (DeepSpeed set-up) can be left out."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.times, self._start = device, [], 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        synchronize(self.device)
        self._start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        synchronize(self.device)
        self.times.append(time.perf_counter() - self._start)


def zero2_worker(run: Run) -> None:
    """Runs inside ``accelerate launch --config_file recipes/accelerate/zero2.yaml``: trains ZERO2_STEPS steps."""
    from datasets import Dataset

    from trims_hf import MDLMConfig, MDLMTrainer

    student = lora_student(run, run.student)
    model, lora = student.model, student.lora_parameters
    collators = student_collators(run, model)
    timer = _StepTimer(run.device)
    with tempfile.TemporaryDirectory() as tmp:
        args = MDLMConfig(output_dir=tmp, report_to="none", max_steps=ZERO2_STEPS, per_device_train_batch_size=1,
                          learning_rate=1e-4, save_strategy="no", logging_steps=1, disable_tqdm=True,
                          **trainer_settings(run))
        trainer = MDLMTrainer(model, args, data_collator=collators["trims"], callbacks=[timer],
                              train_dataset=Dataset.from_list(training_rows(run, ZERO2_STEPS)))
        reset_peak_memory(run.device)
        trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    run.emit("zero2", {
        "measurement": "deepspeed_zero2_steps", "model": MODEL_NAMES[run.student],
        "launch": "accelerate launch --config_file recipes/accelerate/zero2.yaml --num_processes 1",
        "lora": {"r": 32, "alpha": 32, "parameters": lora},
        "zero_stage": trainer.model_wrapped.zero_optimization_stage() if trainer.is_deepspeed_enabled else None,
        "sequence_length": SEQUENCE_LENGTH[run.scale], "per_device_batch": 1, "steps": ZERO2_STEPS, "losses": losses,
        "mixed_precision": trainer.accelerator.mixed_precision,
        "step_s": [round(t, 4) for t in timer.times],
        "tokens_per_s_after_first": round(SEQUENCE_LENGTH[run.scale] * (len(timer.times) - 1) / sum(timer.times[1:]), 1),
        **peak_memory(run.device),
        "completed": trainer.is_deepspeed_enabled and len(losses) == ZERO2_STEPS and all(map(math.isfinite, losses)),
    })


def zero2_part(run: Run) -> None:
    """Launch this script's ZeRO-2 worker as users launch training: the shipped YAML, one process."""
    settings = ["--scale", run.scale, "--student", run.student, "--device", str(run.device),
                "--dtype", str(run.dtype).removeprefix("torch.")]
    settings += ["--output", str(run.output)] if run.output else []
    settings += ["--attn-implementation", run.attn_implementation] if run.attn_implementation else []
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate/zero2.yaml",
               "--num_processes", "1", str(Path(__file__).resolve()), *settings, "--part", "zero2", "--zero2-worker"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: the ZeRO-2 worker failed (exit {result.returncode}):\n{result.stdout[-3000:]}"
                         f"{result.stderr[-3000:]}")
    print(result.stdout.strip(), flush=True)


# --- part 2: teacher scoring -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LengthModel:
    """Log-normal token lengths (median, sigma), clipped to [low, high]."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.clip(np.rint(rng.lognormal(math.log(self.median), self.sigma, count)), self.low, self.high).astype(int)


# Assumed s1K-like lengths in Qwen3 tokens (s1K itself is not reachable offline): questions ~160 tokens, a
# thinking trace plus answer ~3,600 tokens at the median with a long tail (mean ~4,500), capped at 16,384.
S1K_PROMPT = LengthModel(median=160, sigma=0.6, low=16, high=2048)
S1K_COMPLETION = LengthModel(median=3600, sigma=0.7, low=128, high=16384)
TINY_LENGTH_DIVISOR = 32
S1K_ROWS = 1000


def s1k_like_lengths(rows: int, scale: str, seed: int = 0) -> list[tuple[int, int]]:
    """(prompt, completion) token lengths of ``rows`` s1K-like rows; tiny scale divides them by 32."""
    rng = np.random.default_rng(seed)
    divisor = TINY_LENGTH_DIVISOR if scale == "tiny" else 1
    models = [replace(m, median=m.median / divisor, low=max(1, m.low // divisor), high=m.high // divisor)
              for m in (S1K_PROMPT, S1K_COMPLETION)]
    return list(zip(*(m.draw(rng, rows).tolist() for m in models)))


def synthetic_rows(lengths: list[tuple[int, int]], seed: int = 0) -> tuple[list[EncodedRow], list[str]]:
    """Encoded teacher rows of random ids with one character per completion token (spans the scorer validates)."""
    rng = np.random.default_rng(seed)
    rows, completions = [], []
    for index, (prompt, completion) in enumerate(lengths):
        ids = tuple(rng.integers(3, TOKEN_ID_HIGH, prompt + completion).tolist())
        rows.append(EncodedRow(index, ids, prompt, tuple((i, i + 1) for i in range(completion)), False))
        completions.append("x" * completion)
    return rows, completions


PROFILED_BATCHES = 3
"""Batches a ``--profile`` run of the score part scores: enough for the operator table, quick under the profiler."""


def score_part(run: Run) -> None:
    """Times the library's scoring (``score_rows``: forwards, chunked head, per-row checks), as ``trims score`` runs
    it, batch by batch of the planner's batches (in a seeded random order, so a run cut by ``--score-budget-s`` has
    scored a fair sample of lengths), after a warm-up on the largest batch. Stops after the batch that passes the
    budget and extrapolates the whole run and s1K from the tokens/s of the batches scored."""
    model = build_model("teacher", run.scale, run.device, run.dtype, run.attn_implementation).eval()
    check_chunked_head(model)  # what load_teacher checks before scoring
    options = ScoringOptions(max_tokens_per_batch=run.max_tokens_per_batch,
                             logits_chunk_elements=run.logits_chunk_elements)
    lengths = s1k_like_lengths(run.score_rows, run.scale)
    rows, completions = synthetic_rows(lengths)
    planned = plan_batches([len(r.input_ids) for r in rows], options.max_tokens_per_batch)

    def score(batch: list[int]) -> None:
        score_rows(model, [rows[i] for i in batch], [completions[i] for i in batch], options, 0)

    score(planned[0])  # warm-up, largest batch
    order = np.random.default_rng(0).permutation(len(planned))[:PROFILED_BATCHES if run.profile else None]
    reset_peak_memory(run.device)
    synchronize(run.device)
    start = time.perf_counter()
    scored: list[int] = []
    batches = 0
    for index in order.tolist():
        score(planned[index])
        scored, batches = scored + planned[index], batches + 1
        if time.perf_counter() - start > run.score_budget_s:
            break
    synchronize(run.device)
    seconds = time.perf_counter() - start
    tokens = sum(len(rows[i].input_ids) for i in scored)
    planned_tokens = sum(len(r.input_ids) for r in rows)
    tokens_per_s = tokens / seconds
    s1k_seconds = planned_tokens / tokens_per_s * S1K_ROWS / run.score_rows
    run.emit("score", {
        "measurement": "teacher_scoring", "model": MODEL_NAMES["teacher"],
        "shape": shape(model.config, model.num_parameters()),
        "attn_implementation": model.config._attn_implementation, "rows": run.score_rows,
        "lengths": {"prompt": asdict(S1K_PROMPT), "completion": asdict(S1K_COMPLETION),
                    "divided_by": TINY_LENGTH_DIVISOR if run.scale == "tiny" else 1,
                    "source": "assumed s1K-like (s1K not reachable offline)",
                    "prompt_tokens": sum(p for p, _ in lengths), "completion_tokens": sum(c for _, c in lengths),
                    "longest_row": max(p + c for p, c in lengths)},
        "max_tokens_per_batch": options.max_tokens_per_batch,
        "logits_chunk_elements": options.logits_chunk_elements,
        "positions_per_logits_chunk": max(1, options.logits_chunk_elements // model.config.vocab_size),
        "budget_s": run.score_budget_s, "batches_planned": len(planned), "batches_scored": batches,
        "rows_scored": len(scored), "complete": len(scored) == len(rows),
        "teacher_tokens_planned": planned_tokens, "teacher_tokens": tokens, "seconds": round(seconds, 6),
        "tokens_per_s": round(tokens_per_s, 1), **peak_memory(run.device),
        "seconds_per_million_tokens": round(1e6 / tokens_per_s, 2),
        "goal_seconds_per_million_tokens_max": SCORE_SECONDS_PER_MILLION_MAX,
        "s1k_curation_estimate_s": round(s1k_seconds, 3), "s1k_curation_estimate_gpu_hours": round(s1k_seconds / 3600, 4),
        "estimate": "the planned tokens (then 1,000 rows) at the tokens/s of the batches scored",
        "paper_curation_a100_gpu_hours": 0.6, **run.judge(1e6 / tokens_per_s / SCORE_SECONDS_PER_MILLION_MAX),
    })


# --- part 3: decoding --------------------------------------------------------------------------------------------

DECODE_PROMPT_TOKENS = 128
DECODE_BATCHES = {"tiny": (1, 4), "real": (1, 16)}
DECODE_GEN_LENGTH = {"tiny": 64, "real": 256}
"""Tiny scale decodes 2 blocks (enough for every cache mode to refresh once), the real one the paper's 256."""


def weight_read_bytes(model: nn.Module) -> int:
    """Bytes a forward must read from memory at least once: every parameter but the input embedding table (of
    which only the looked-up rows are read)."""
    embedding = model.get_input_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters()) - embedding.numel() * embedding.element_size()


@dataclass
class CallTimes:
    """Per decoder model call (:class:`trims_hf.generation.StudentForward`, whatever runs it: an eager forward or a
    graph replay): the device's time between CUDA events around it (GPU idle gaps while the host launches included,
    so a host-bound call shows its true cost), and the host's time to issue it (the wall clock, no sync). On a CPU
    both are the wall clock."""

    device_s: list[Callable[[], float]]
    host_s: list[float]

    def summary(self) -> dict[str, float]:
        device = statistics.mean(read() for read in self.device_s)
        return {"forward_ms": device * 1e3, "host_ms_per_forward": statistics.mean(self.host_s) * 1e3,
                "forward_calls": len(self.host_s)}


@contextmanager
def forward_times(device: torch.device, model: nn.Module) -> Iterator[CallTimes]:
    """Times every decoder model call made inside the block (:class:`CallTimes`); no sampling, strategy or hooks. The
    calls are :class:`StudentForward`'s, or, for a block-diffusion student (whose decoder calls the model itself), the
    model's own."""
    cuda = device.type == "cuda"
    times = CallTimes([], [])
    owner, name = (type(model), "forward") if student_spec(model).block_size is not None else (StudentForward, "__call__")
    call = getattr(owner, name)

    def timed(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        begin_host = time.perf_counter()
        begin = torch.cuda.Event(enable_timing=True) if cuda else None
        if cuda:
            begin.record()
        logits = call(self, *args, **kwargs)
        end_host = time.perf_counter()
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            times.device_s.append(lambda: begin.elapsed_time(end) / 1e3)
        else:
            times.device_s.append(lambda: end_host - begin_host)
        times.host_s.append(end_host - begin_host)
        return logits

    setattr(owner, name, timed)
    try:
        yield times
    finally:
        setattr(owner, name, call)
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


def decode_part(run: Run) -> None:
    """Per batch, cache mode and step mode: the decoder's model calls alone (:func:`forward_times`) next to the
    weight-read bound, the whole decoding's wall time per call, tokens/s and peak memory; prompts left-padded with
    their mask. The static step is measured at batch 1 only, where host time decides (at batch 16 it is eager's
    kernels without the launches' cost, which graph also removes). Then SDPA alone under the padded batch's mask
    forms (:func:`mask_forms`)."""
    model = build_model(run.student, run.scale, run.device, run.dtype, run.attn_implementation).eval()
    peak = accelerator(device_name(run.device))
    weight_bytes = weight_read_bytes(model)
    bound_ms = weight_read_bound_ms(weight_bytes, peak)
    gen_length = 2 * 32 if run.profile else DECODE_GEN_LENGTH[run.scale]  # profiled: two blocks, one refresh
    base = DecodingConfig(gen_length=gen_length, block_length=32, threshold=0.9, early_stop=False)
    pad_id = model.config.pad_token_id
    batches = DECODE_BATCHES[run.scale][:1 if run.profile else None]
    with torch.inference_mode():
        warm = padded_prompts(1, DECODE_PROMPT_TOKENS, pad_id, run.device)
        for mode in run.cache_modes:  # warm-up: kernels and allocator, one block per mode
            generate(model, *warm, config=replace(base, gen_length=base.block_length, cache=mode, step="eager"))
        single: dict[tuple[str, str], float] = {}
        """Tokens/s of each (cache, step) at batch 1 (the first batch), the reference of the batch goal."""
        for batch in batches:
            prompts = padded_prompts(batch, DECODE_PROMPT_TOKENS, pad_id, run.device)
            steps = tuple(step for step in run.step_modes if step != "static" or batch == batches[0])
            results, calls, memory = {}, {}, {}
            for mode in run.cache_modes:
                for step in steps:
                    reset_peak_memory(run.device)
                    try:
                        with forward_times(run.device, model) as times:
                            results |= decode_modes(model, [prompts], base, (mode,), (step,))
                    except RuntimeError as error:  # one mode failing on the device must not cost the others' lines
                        run.emit("decode", {"measurement": "decode", "model": MODEL_NAMES[run.student], "batch": batch,
                                            "cache": mode, "step": step, "error": f"{type(error).__name__}: {error}"[:2000]})
                        release(run.device)
                        continue
                    calls[mode, step], memory[mode, step] = times.summary(), peak_memory(run.device)
            per_second = {key: summary["tokens_per_second"] for key, (summary, _) in results.items()}
            single = single or per_second
            for (mode, step), (summary, responses) in results.items():
                if ("none", step) not in results or (mode, step) not in single:
                    continue  # its reference failed: the error line says why
                timing = calls[mode, step]
                forward_ms = timing["forward_ms"]
                speedup = per_second[mode, step] / per_second["none", step]
                over_single = per_second[mode, step] / single[mode, step]
                judged = None
                if mode == "dual" and step == run.step_modes[-1]:  # the default step: graph on CUDA
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
                    "threshold": base.threshold, "early_stop": False, "cache": mode, "step": step,
                    "nfe": summary["nfe"], "model_forwards": summary["model_forwards"],
                    "tokens_per_step": round(summary["tokens_per_step"], 3),
                    "wall_time_s": round(summary["wall_time_s"], 6),
                    "wall_ms_per_model_forward": round(summary["wall_time_s"] * 1e3 / summary["model_forwards"], 3),
                    "forward_ms": round(forward_ms, 3), "host_ms_per_forward": round(timing["host_ms_per_forward"], 3),
                    "forward_calls": timing["forward_calls"],
                    "forward_timing": "CUDA events around each decoder model call (eager forward or graph replay); "
                    "host_ms: the host's time to issue it" if run.device.type == "cuda"
                    else "wall clock around each decoder model call",
                    "tokens_per_s": round(per_second[mode, step], 1), "speedup_over_no_cache": round(speedup, 3),
                    "identical_tokens_vs_no_cache": round(identical_fraction(responses, results["none", step][1]), 4),
                    "identical_tokens_vs_eager": identical_fraction(responses, results[mode, "eager"][1])
                    if (mode, "eager") in results else None,
                    **memory[mode, step], "graph_memory_gib": graph_memory,
                    "weight_read_bytes": weight_bytes, "accelerator": peak.name if peak else None,
                    "bandwidth_tb_s": peak.bandwidth_tb_s if peak else None,
                    "weight_read_bound_ms": round(bound_ms, 3) if bound_ms else None,
                    "forward_over_bound": round(forward_ms / bound_ms, 3) if bound_ms else None,
                    "tokens_per_s_over_batch_1": round(over_single, 3),
                    "goals": {"batch1_dual_forward_over_bound_max": FORWARD_OVER_BOUND_MAX,
                              "batch1_dual_speedup_over_no_cache_min": DUAL_SPEEDUP_MIN,
                              f"batch{batches[-1]}_dual_tokens_per_s_over_eager_min": BATCH_OVER_EAGER_MIN,
                              "judged_on": f"dual cache, step {run.step_modes[-1]}"},
                    **run.judge(judged),
                    "note": "random weights: about one token committed per step, so every mode does the same steps",
                })
        mask_forms(run, model.config, batches[-1], DECODE_PROMPT_TOKENS + gen_length, base.block_length)


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


# --- command line ------------------------------------------------------------------------------------------------

PARTS = ("train", "zero2", "score", "decode")
STEP_MODES = {"cuda": ("eager", "static", "graph"), "cpu": ("eager", "static")}
"""Step modes the decode part can time per device type (CUDA graphs need CUDA)."""
SCALE_DEFAULTS = {"tiny": {"steps": 2, "max_batch": 4, "score_rows": 40},
                  "real": {"steps": 8, "max_batch": 32, "score_rows": 1000}}
SCORE_BUDGET_S = 420.0
"""Scoring stops after the batch that passes this: with the model build and warm-up, inside a 10-minute command."""
CUDA_LOGITS_CHUNK_ELEMENTS = 2**27
"""The scorer's head chunk on CUDA (~880 positions at vocab 152k, 0.25 GiB bf16): the library's 2**24 (~110 positions)
re-reads the 1.24 GB head ~43k times over the s1K-like rows, ~16 s of reads on an H100."""


def parse(argv: list[str]) -> tuple[argparse.Namespace, Run]:
    parser = argparse.ArgumentParser(prog="bench/real_size.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=("tiny", "real"), default="tiny")
    parser.add_argument("--part", choices=(*PARTS, "all"), default="all")
    parser.add_argument("--student", choices=("llada", "dream", "llada_moe", "llada2"), default="llada",
                        help="student shape of the train, zero2 and decode parts (the goals are set for llada)")
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                        help="default: bfloat16 on CUDA, float32 on a CPU")
    parser.add_argument("--attn-implementation", default=None, help="e.g. sdpa, flash_attention_2 (default: transformers')")
    parser.add_argument("--output", type=Path, default=None, help="append the JSON lines to this file")
    parser.add_argument("--steps", type=int, default=None, help="timed training steps per variant")
    parser.add_argument("--max-batch", type=int, default=None, help="upper end of the per-device batch search")
    parser.add_argument("--score-rows", type=int, default=None, help="rows scored by the teacher")
    parser.add_argument("--max-tokens-per-batch", type=int, default=ScoringOptions.max_tokens_per_batch)
    parser.add_argument("--logits-chunk-elements", type=int, default=None,
                        help=f"scorer head chunk, positions x vocab (default: {CUDA_LOGITS_CHUNK_ELEMENTS} on CUDA, "
                             f"the library's {ScoringOptions.logits_chunk_elements} on a CPU)")
    parser.add_argument("--score-budget-s", type=float, default=SCORE_BUDGET_S,
                        help="stop scoring after the batch that passes this many seconds and extrapolate")
    parser.add_argument("--cache-modes", default=",".join(CACHE_MODES),
                        help="comma-separated cache modes of the decode part; must include none (the reference)")
    parser.add_argument("--train-variants", default="eager",
                        help=f"comma-separated variants of the train part, each on a fresh student: {', '.join(TRAIN_VARIANTS)}")
    parser.add_argument("--checkpointing", default="off,on",
                        help="gradient-checkpointing settings of the train part: off, on or off,on")
    parser.add_argument("--train-profile", type=Path, default=None,
                        help="append a summary of a profiled training step (the first variant's largest batch) here")
    parser.add_argument("--step-modes", default=None,
                        help="comma-separated step modes of the decode part, eager first (the reference); default: "
                             f"{','.join(STEP_MODES['cuda'])} on CUDA, {','.join(STEP_MODES['cpu'])} on a CPU")
    parser.add_argument("--profile", type=Path, default=None,
                        help="append a torch.profiler table of each part (train, score, decode) to this file")
    parser.add_argument("--zero2-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag in ("steps", "max_batch", "score_rows"):
        value = getattr(args, flag)
        setattr(args, flag, SCALE_DEFAULTS[args.scale][flag] if value is None else value)
        if getattr(args, flag) < 1:
            parser.error(f"argument --{flag.replace('_', '-')}: must be at least 1, got {value}")
    for flag in ("max_tokens_per_batch", "logits_chunk_elements"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"argument --{flag.replace('_', '-')}: must be at least 1, got {value}")
    cache_modes = tuple(dict.fromkeys(mode.strip() for mode in args.cache_modes.split(",")))
    unknown = [mode for mode in cache_modes if mode not in CACHE_MODES]
    if unknown or "none" not in cache_modes:
        parser.error(f"argument --cache-modes: {args.cache_modes!r}: choose from {', '.join(CACHE_MODES)}, "
                     "none included (the reference)")
    if args.score_budget_s <= 0:
        parser.error(f"argument --score-budget-s: must be positive, got {args.score_budget_s}")
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as error:
        parser.error(f"argument --device: {error}")
    if device.type == "cuda" and device.index not in (None, 0):
        parser.error(f"argument --device: {device} is not supported (the Trainer takes the first visible GPU); "
                     f"use --device cuda with CUDA_VISIBLE_DEVICES={device.index}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"argument --device: {device} asked for, but CUDA is not available here")
    if device.type not in ("cuda", "cpu"):
        parser.error(f"argument --device: {device.type} is not supported (cuda or cpu)")
    train_variants = tuple(dict.fromkeys(name.strip() for name in args.train_variants.split(",")))
    if not train_variants or any(name not in TRAIN_VARIANTS for name in train_variants):
        parser.error(f"argument --train-variants: {args.train_variants!r}: choose from {', '.join(TRAIN_VARIANTS)}")
    settings = {"off": False, "on": True}
    checkpointing = tuple(dict.fromkeys(settings.get(name.strip()) for name in args.checkpointing.split(",")))
    if None in checkpointing:
        parser.error(f"argument --checkpointing: {args.checkpointing!r}: off, on or off,on")
    for flag in ("output", "profile", "train_profile"):
        path = getattr(args, flag)
        if path is not None and not path.parent.is_dir():
            parser.error(f"argument --{flag}: folder {path.parent} does not exist")
    step_modes = tuple(dict.fromkeys(mode.strip() for mode in (args.step_modes or ",".join(STEP_MODES[device.type]))
                                     .split(",")))
    if step_modes[0] != "eager" or any(mode not in STEP_MODES["cuda"] for mode in step_modes):
        parser.error(f"argument --step-modes: {args.step_modes!r}: eager first, then any of static, graph")
    if "graph" in step_modes and device.type != "cuda":  # the CPU pre-flight passes the GPU window's flags
        step_modes = tuple(mode for mode in step_modes if mode != "graph")
        print(f"note: --step-modes: CUDA graphs need CUDA; the decode part times {','.join(step_modes)} on the "
              f"{device.type}", file=sys.stderr)
    block_modes = (tuple(dict.fromkeys("prefix" if mode == "dual" else mode for mode in cache_modes)), ("eager",))
    if STUDENTS[args.student].block_size is not None and (cache_modes, step_modes) != block_modes:
        cache_modes, step_modes = block_modes  # the block-causal decoder: no suffix to cache (dual is its prefix)
        print(f"note: {args.student} decodes block-causally: the decode part times cache {','.join(cache_modes)}, "
              "step eager", file=sys.stderr)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    chunk = args.logits_chunk_elements or (CUDA_LOGITS_CHUNK_ELEMENTS if device.type == "cuda"
                                           else ScoringOptions.logits_chunk_elements)
    run = Run(args.scale, args.student, device, dtype, args.attn_implementation, args.output and args.output.resolve(),
              args.steps, args.max_batch, args.score_rows, args.max_tokens_per_batch, chunk, args.score_budget_s,
              cache_modes, step_modes, args.profile and args.profile.resolve(), train_variants, checkpointing,
              args.train_profile and args.train_profile.resolve())
    return args, run


def main(argv: list[str] | None = None) -> None:
    # Before CUDA's allocator starts: segments that grow, so the batch search's freed blocks are not stranded.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    args, run = parse(sys.argv[1:] if argv is None else argv)
    if args.zero2_worker:
        zero2_worker(run)
        return
    parts = {"train": train_part, "score": score_part, "decode": decode_part}
    for name in PARTS if args.part == "all" else (args.part,):
        if name == "zero2":  # a subprocess: nothing to profile here
            zero2_part(run)
        else:
            with profiled(run, name):
                parts[name](run)
        release(run.device)


if __name__ == "__main__":
    main()
