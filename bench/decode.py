"""Decoding throughput with no cache, prefix cache and dual cache, eager and static steps; prints one JSON line.

A random Llama student (hidden 256, 4 layers, vocab 1000) decodes several prompts one at a time with the
paper's decoder (threshold 0.9, gen length 256, block 32). Early stop is off and every generated position
is counted, so all modes do the same amount of work; ``*_identical_tokens`` is the fraction of tokens equal
to the no-cache output (cache drift). Goal: dual cache >= 1.5x the no-cache tokens/s. The CPU guard of the
static step (``DecodingConfig.step``): per cache mode, its tokens/s >= 0.95x the eager step's in the same run,
and the very same tokens (``*_static_identical_tokens`` = 1); eager and static alternate prompt by prompt, so
a load change on the machine hits both.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trims_hf import prepare_student
from trims_hf.generation import DecodingConfig, TokensPerStepRecorder, generate

CACHE_MODES = ("none", "prefix", "dual")


def random_student(vocab: int, hidden: int, layers: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=1024,
        eos_token_id=vocab - 2,
    )
    return prepare_student(LlamaForCausalLM(config).eval(), "llada", vocab - 1)


STEP_MODES = ("eager", "static")
STATIC_OVER_EAGER_MIN = 0.95


COMPILED = "+compiled"
"""Suffix of a step label whose decoder blocks are compiled (``DecodingConfig.compile_blocks``), e.g. ``graph+compiled``."""


def step_settings(label: str) -> dict[str, object]:
    """The ``DecodingConfig`` fields of a step label: a step mode, with :data:`COMPILED` when the blocks are compiled."""
    return {"step": label.removesuffix(COMPILED), "compile_blocks": label.endswith(COMPILED)}


def decode_modes(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor | None]], base: DecodingConfig,
                 modes: tuple[str, ...] = CACHE_MODES,
                 steps: tuple[str, ...] = ("eager",)) -> dict[tuple[str, str], tuple[dict[str, object], list[torch.Tensor]]]:
    """Decode every batch of (left-padded prompts, attention mask or None) with each cache mode and step label
    (:func:`step_settings`): the recorder's summary and the responses, by (cache, step label). The step labels take
    turns batch by batch."""
    results = {}
    for mode in modes:
        recorders = {step: TokensPerStepRecorder() for step in steps}
        outputs: dict[str, list[torch.Tensor]] = {step: [] for step in steps}
        for ids, mask in batches:
            for step in steps:
                config = replace(base, cache=mode, **step_settings(step))
                outputs[step].append(generate(model, ids, mask, config=config, hooks=[recorders[step]]).responses)
        results |= {(mode, step): (recorders[step].summary(), outputs[step]) for step in steps}
    return results


def identical_fraction(responses: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Fraction of generated tokens equal to the reference decoding's (1.0: a cache mode drifted nowhere)."""
    same = torch.cat([(a == b).flatten() for a, b in zip(responses, reference)])
    return float(same.double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--gen-length", type=int, default=256)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = random_student(vocab=1000, hidden=256, layers=4, seed=0)
    prompts = torch.randint(0, 998, (args.prompts, args.prompt_length), generator=torch.Generator().manual_seed(0))
    base = DecodingConfig(
        gen_length=args.gen_length, block_length=args.block_length, threshold=args.threshold, early_stop=False
    )
    generate(model, prompts[:1], config=replace(base, gen_length=args.block_length))  # warm-up

    result: dict[str, object] = {
        "bench": "decode",
        "model": "random llama h256 l4 v1000",
        "prompts": args.prompts,
        "gen_length": args.gen_length,
        "block_length": args.block_length,
        "threshold": args.threshold,
        "early_stop": False,
        "threads": args.threads,
    }
    decoded = decode_modes(model, [(prompt[None], None) for prompt in prompts], base, steps=STEP_MODES)
    outputs = {key: responses for key, (_, responses) in decoded.items()}
    for (mode, step), (summary, _) in decoded.items():
        name = mode if step == "eager" else f"{mode}_{step}"
        result[f"{name}_tokens_per_second"] = round(summary["tokens_per_second"], 1)
        result[f"{name}_nfe"] = summary["nfe"]
        result[f"{name}_tokens_per_step"] = round(summary["tokens_per_step"], 3)
    for mode in ("prefix", "dual"):
        result[f"{mode}_speedup"] = round(result[f"{mode}_tokens_per_second"] / result["none_tokens_per_second"], 2)
        result[f"{mode}_identical_tokens"] = round(identical_fraction(outputs[mode, "eager"], outputs["none", "eager"]), 3)
    guard = []
    for mode in CACHE_MODES:
        ratio = decoded[mode, "static"][0]["tokens_per_second"] / decoded[mode, "eager"][0]["tokens_per_second"]
        identical = identical_fraction(outputs[mode, "static"], outputs[mode, "eager"])
        result[f"{mode}_static_over_eager"] = round(ratio, 3)
        result[f"{mode}_static_identical_tokens"] = identical
        guard.append(ratio >= STATIC_OVER_EAGER_MIN and identical == 1.0)
    result["static_goal"] = f"static tokens/s >= {STATIC_OVER_EAGER_MIN}x eager, identical tokens, every cache mode"
    result["static_goal_met"] = all(guard)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
