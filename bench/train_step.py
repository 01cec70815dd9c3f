"""Median optimizer-step time with TRIMS vs standard MDLM masking on the same small student.

A step is collate + forward + backward + AdamW update through MDLMTrainer.training_step. Steps of
the two variants are interleaved so that machine noise hits both alike. Prints one JSON line.
Goal: TRIMS costs <= 2% more per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collator import _Tokenizer, prepared_rows  # noqa: E402

from trims_hf import MDLMConfig, MDLMTrainer, TrimsDataCollator, prepare_student  # noqa: E402


def build_trainer(ratio: float, length: int, output_dir: str) -> MDLMTrainer:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=length)
    model = prepare_student(LlamaForCausalLM(config), "llada", mask_token_id=_Tokenizer.mask_token_id)
    args = MDLMConfig(output_dir=output_dir, report_to="none", use_cpu=True, learning_rate=1e-4, max_steps=1,
                      trajectory_ratio=ratio, max_length=length)
    collator = TrimsDataCollator(_Tokenizer(), masking=args.masking(), max_length=length)
    trainer = MDLMTrainer(model, args, data_collator=collator)
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    return trainer


def step(trainer: MDLMTrainer, rows: list[dict]) -> float:
    start = time.perf_counter()
    batch = trainer.data_collator(rows)
    trainer.training_step(trainer.model, batch)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    args = parser.parse_args()
    rows = prepared_rows(args.steps * args.batch_size, args.length, prompt=64)
    batches = [rows[i:i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
    with tempfile.TemporaryDirectory() as tmp:
        trims, mdlm = build_trainer(0.1, args.length, tmp), build_trainer(0.0, args.length, tmp)
        step(trims, batches[0]), step(mdlm, batches[0])  # warm-up
        trims_times, mdlm_times = [], []
        for batch in batches:
            trims_times.append(step(trims, batch))
            mdlm_times.append(step(mdlm, batch))
    trims_median, mdlm_median = statistics.median(trims_times), statistics.median(mdlm_times)
    print(json.dumps({
        "bench": "train_step",
        "model": "llama hidden 128, 2 layers, vocab 8000",
        "batch_shape": [args.batch_size, args.length],
        "steps_each": args.steps,
        "trims_median_step_s": round(trims_median, 4),
        "mdlm_median_step_s": round(mdlm_median, 4),
        "trims_over_mdlm": round(trims_median / mdlm_median, 4),
        "goal_trims_over_mdlm_max": 1.02,
    }))


if __name__ == "__main__":
    main()
