"""The paper's models at their true shapes: training, teacher scoring and decoding; one JSON line per measurement.

``--scale real`` builds randomly initialised models in the exact shapes of the public config.json files, directly
on ``--device`` in ``--dtype`` (no CPU init); ``--scale tiny`` builds the same architecture classes through the
same code paths with tiny dimensions, so the whole script runs on a CPU in seconds (the test suite does that).
Student shapes go through the library's own config translation (``llama_config_from_llada``,
``qwen2_config_from_dream``) from dicts mirroring the public config.json; attention is whatever transformers
picks on the device (SDPA on CUDA unless ``--attn-implementation`` says otherwise), recorded in every line.

Parts (each sized to finish within a 10-minute command on one H100; each a module of ``bench/real_size_parts/``, what
they share in its ``common.py``; this file is their command line):

- ``train``: LoRA r=32 / alpha=32 student (all attention and MLP projections, ``trims_hf.lora_config``) at sequence
  length 1024 through MDLMTrainer, its model prepared by the Trainer's accelerator as ``Trainer.train`` does (bf16
  autocast, fp32 outputs, gradient clipping): per-device batch 1 and the largest batch that fits (searched: doubling,
  then bisection, an out-of-memory step counts as "does not fit"), with and without gradient checkpointing; TRIMS
  (trajectory ratio 0.1) and MDLM (ratio 0) steps interleaved on the same model, their step-time ratio, tokens/s
  (padded and real), peak memory and model FLOPs utilisation (:func:`training_flops_per_token` states the convention).
- ``recipe``: ``--steps`` optimizer steps of ``recipes/<student>/trims_s1k.yaml`` as ``trims train`` runs it (its
  parser, its LoRA wrapping, MDLMTrainer with the recipe's batch search and compiled blocks) on the true-shape student:
  tokens/s, MFU, the global batch and its split, the projected minutes of the whole s1K run (30 epochs) on the device.
- ``zero2``: one DeepSpeed ZeRO-2 training run of a few steps through the shipped ``recipes/accelerate/zero2.yaml``
  (and the zero2.json it names), launched with ``accelerate launch --num_processes 1``.
- ``score``: the Qwen3-8B-shaped teacher over ``--score-rows`` rows of s1K-like lengths (:func:`s1k_like_lengths`)
  with the library's planner and scorer, until ``--score-budget-s``: tokens/s, peak memory, extrapolated s1K curation
  time, the 1M-tokens goal.
- ``decode``: the LLaDA-8B-shaped student, gen 256, block 32, threshold 0.9, batch 1 and 16 or ``--decode-batches``
  (left-padded prompts of different lengths with their mask), no / prefix / dual cache: model forward time (CUDA
  events), wall time per model call, tokens/s, NFE, tokens identical to no cache, and the weight-read bound (weight
  bytes / memory bandwidth).

Public configs (verified with the search tool on 2026-11-26; the Hub itself is unreachable here):
- LLaDA-8B-Instruct: a copy of its config.json in github.com/yinj66/support_basis
  ("LLaDA-8B-Instruct-B&S-light/config.json"): d_model 4096, n_layers 32, n_heads = n_kv_heads 32,
  mlp_hidden_size 12288, vocab_size = embedding_size 126464, max_sequence_length 4096, rope_theta 500000,
  rms_norm_eps 1e-5, weight_tying false, no biases, mask 126336, eos = pad 126081.
- Dream-v0-Instruct-7B: its own config.json is not in the index; the same DreamModel config of
  apple/DiffuCoder-7B-Instruct (huggingface.co/apple/DiffuCoder-7B-Instruct/resolve/main/config.json, also
  Qwen2.5-7B-based) and Qwen2.5-7B's config give: hidden 3584, 28 layers, 28 heads / 4 KV (head_dim 128),
  intermediate 18944, vocab 152064, max_position_embeddings 131072, rope_theta 1e6, rms_norm_eps 1e-6,
  tie_word_embeddings false, mask 151666, bos = eos = pad 151643 (the tiny Dream fixture keeps every field of that
  config but sizes and special ids: its provenance in tests/fixtures/README.md).
- LLaDA-MoE-7B-A1B-Instruct (``--student llada_moe``): its Hub config.json as a third-party guide quotes it (found with
  the search tool's find_string/read_file, consistent with a vLLM plugin's docs; not byte-verified): hidden 2048,
  16 layers, 16 heads / 16 KV, 64 experts of 1,024, 8 routed per token, every layer sparse, vocab 157184, rope_theta
  50000, q/k norms; the mask id 156895 is not in it (the port's default). The experts are fused 3-D weights, so
  :func:`linear_weights` counts the 8 routed experts per token, not all 64; the weight-read bound counts the experts
  the forward's tokens reach (``real_size_parts.decode.weight_read_bytes``).
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
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from decode import CACHE_MODES, COMPILED  # noqa: E402
from real_size_parts.common import Run, profiled, release  # noqa: E402
from real_size_parts.decode import DECODE_BATCHES, decode_part, parse_decode_batches, without_graphs  # noqa: E402
from real_size_parts.recipe import recipe_part  # noqa: E402
from real_size_parts.score import score_part  # noqa: E402
from real_size_parts.train import TRAIN_VARIANTS, train_part  # noqa: E402
from real_size_parts.zero2 import zero2_part, zero2_worker  # noqa: E402

from trims_hf.commands import growable_cuda_segments  # noqa: E402
from trims_hf.settings import ScoringOptions  # noqa: E402
from trims_hf.students import STUDENTS  # noqa: E402

# --- command line ------------------------------------------------------------------------------------------------

PARTS = ("train", "recipe", "zero2", "score", "decode")
STEP_MODES = {"cuda": ("eager", "static", "graph"), "cpu": ("eager", "static")}
"""Step modes the decode part can time per device type (CUDA graphs need CUDA); each of static and graph also with
its decoder blocks compiled (``graph+compiled``: ``DecodingConfig.compile_blocks``)."""
COMPILED_STEPS = tuple(step + COMPILED for step in ("static", "graph"))
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
                        help="comma-separated step modes of the decode part, eager first (the reference), then any of "
                             f"static, graph, {', '.join(COMPILED_STEPS)} (blocks compiled, timed at batch 1); "
                             f"default: {','.join(STEP_MODES['cuda'])} on CUDA, {','.join(STEP_MODES['cpu'])} on a CPU")
    parser.add_argument("--decode-batches", default=None,
                        help="comma-separated batches of the decode part, rising from 1 (default: "
                             f"{','.join(map(str, DECODE_BATCHES['real']))} at real scale, "
                             f"{','.join(map(str, DECODE_BATCHES['tiny']))} at tiny)")
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
    decode_batches = None
    if args.decode_batches is not None:
        try:
            decode_batches = parse_decode_batches(args.decode_batches)
        except ValueError as error:
            parser.error(f"argument --decode-batches: {args.decode_batches!r}: {error}")
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
    for name in ("output", "profile", "train_profile"):
        path, flag = getattr(args, name), name.replace("_", "-")
        if path is not None and not path.parent.is_dir():
            parser.error(f"argument --{flag}: folder {path.parent} does not exist")
        if path is not None and path.is_dir():
            parser.error(f"argument --{flag}: {path} is a folder; name a file in it")
    step_modes = tuple(dict.fromkeys(mode.strip() for mode in (args.step_modes or ",".join(STEP_MODES[device.type]))
                                     .split(",")))
    if step_modes[0] != "eager" or any(mode not in STEP_MODES["cuda"] + COMPILED_STEPS for mode in step_modes):
        parser.error(f"argument --step-modes: {args.step_modes!r}: eager first, then any of static, graph, "
                     f"{', '.join(COMPILED_STEPS)}")
    if any(mode.startswith("graph") for mode in step_modes) and device.type != "cuda":  # the CPU pre-flight passes
        # the GPU window's flags: its compiled graph step is timed as a compiled static step
        step_modes = without_graphs(step_modes)
        print(f"note: --step-modes: CUDA graphs need CUDA; the decode part times {','.join(step_modes)} on the "
              f"{device.type}", file=sys.stderr)
    if STUDENTS[args.student].block_size is not None and "dual" in cache_modes:
        # the block-causal decoder: no suffix to cache (dual is its prefix)
        cache_modes = tuple(dict.fromkeys("prefix" if mode == "dual" else mode for mode in cache_modes))
        print(f"note: {args.student} decodes block-causally: the decode part times cache {','.join(cache_modes)}",
              file=sys.stderr)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    chunk = args.logits_chunk_elements or (CUDA_LOGITS_CHUNK_ELEMENTS if device.type == "cuda"
                                           else ScoringOptions.logits_chunk_elements)
    run = Run(args.scale, args.student, device, dtype, args.attn_implementation, args.output and args.output.resolve(),
              args.steps, args.max_batch, args.score_rows, args.max_tokens_per_batch, chunk, args.score_budget_s,
              cache_modes, step_modes, decode_batches, args.profile and args.profile.resolve(), train_variants,
              checkpointing, args.train_profile and args.train_profile.resolve())
    return args, run


def main(argv: list[str] | None = None) -> None:
    growable_cuda_segments()  # as `trims train` sets CUDA's allocator up, before it starts
    args, run = parse(sys.argv[1:] if argv is None else argv)
    if args.zero2_worker:
        zero2_worker(run)
        return
    parts = {"train": train_part, "recipe": recipe_part, "score": score_part, "decode": decode_part}
    for name in PARTS if args.part == "all" else (args.part,):
        if name == "zero2":  # a subprocess: nothing to profile here
            zero2_part(run)
        else:
            with profiled(run, name):
                parts[name](run)
        release(run.device)


if __name__ == "__main__":
    main()
