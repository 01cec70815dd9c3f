"""Collator throughput on 32 x 1024 batches of prepared rows, TRIMS vs plain MDLM (ratio 0).

Prints one JSON line. Goal: >= 1M tokens/s on one core, TRIMS time close to MDLM time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from trims_hf import MaskingConfig, TrimsDataCollator


class _Tokenizer:
    """Only what the collator reads from a tokenizer for prepared rows."""

    eos_token_id = 1
    mask_token_id = 2


def prepared_rows(n: int, length: int, prompt: int, seed: int = 0, high: int = 8000) -> list[dict]:
    """Prepared rows of ``length // 2`` to ``length`` token ids in ``[3, high)``, with 8 random buckets."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        size = int(rng.integers(length // 2, length + 1))
        rows.append({
            "input_ids": rng.integers(3, high, size).tolist(),
            "prompt_length": prompt,
            "bucket_ids": rng.integers(0, 8, size - prompt).tolist(),
            "example_id": i,
        })
    return rows


def time_collator(collator: TrimsDataCollator, batches: list[list[dict]]) -> list[float]:
    times = []
    for batch in batches:
        start = time.perf_counter()
        collator(batch)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = prepared_rows(args.batches * args.batch_size, args.length, prompt=128)
    batches = [rows[i:i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
    trims = TrimsDataCollator(_Tokenizer(), masking=MaskingConfig(padding="max_length"), max_length=args.length)
    mdlm = TrimsDataCollator(_Tokenizer(), masking=MaskingConfig(padding="max_length", trajectory_ratio=0.0),
                             max_length=args.length)
    time_collator(trims, batches[:3])  # warm-up
    trims_times, mdlm_times = [], []
    for batch in batches:  # interleaved, so machine noise hits both alike
        trims_times += time_collator(trims, [batch])
        mdlm_times += time_collator(mdlm, [batch])
    tokens = args.batch_size * args.length
    trims_median, mdlm_median = statistics.median(trims_times), statistics.median(mdlm_times)
    print(json.dumps({
        "bench": "collator",
        "batch_shape": [args.batch_size, args.length],
        "threads": torch.get_num_threads(),
        "trims_tokens_per_second": round(tokens / trims_median),
        "mdlm_tokens_per_second": round(tokens / mdlm_median),
        "trims_time_over_mdlm_time": round(trims_median / mdlm_median, 4),
        "goal_tokens_per_second": 1_000_000,
    }))


if __name__ == "__main__":
    main()
