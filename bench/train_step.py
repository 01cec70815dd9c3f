"""Median optimizer-step time with TRIMS vs standard MDLM masking on the same small student.

A step is collate + forward + backward + gradient clipping + AdamW update through MDLMTrainer.training_step on the
model as ``Trainer.train`` prepares it (``accelerator.prepare_model``: with ``bf16=True`` under autocast, outputs upcast
to fp32, as real training runs). One model is trained
by two collators that differ only in the trajectory ratio (0.1, the recipes', vs 0: plain MDLM); their steps are
interleaved so that machine noise hits both alike. Prints one JSON line. Goal: TRIMS costs <= 2% more per step.
``bench/real_size.py`` times the paper's model shapes with the same helpers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collator import _Tokenizer, prepared_rows  # noqa: E402

from trims_hf import MaskingConfig, MDLMConfig, MDLMTrainer, TrimsDataCollator, prepare_student  # noqa: E402


def masking_collators(tokenizer: Any, length: int, mask_token_id: int | None = None, padding: str = "longest",
                      ratio: float = 0.1) -> dict[str, TrimsDataCollator]:
    """The TRIMS collator (trajectory ratio ``ratio``) and the plain MDLM one (ratio 0), otherwise identical."""
    return {name: TrimsDataCollator(tokenizer, mask_token_id=mask_token_id, max_length=length,
                                    masking=MaskingConfig(trajectory_ratio=r, padding=padding))
            for name, r in (("trims", ratio), ("mdlm", 0.0))}


def build_trainer(model: torch.nn.Module, collator: TrimsDataCollator, output_dir: str, **config: Any) -> MDLMTrainer:
    """An MDLMTrainer with its AdamW optimizer created and its model prepared by its accelerator as ``Trainer.train``
    does (mixed-precision autocast and fp32 outputs under ``bf16=True``), ready for :func:`step` (``config`` goes to
    MDLMConfig)."""
    args = MDLMConfig(output_dir=output_dir, report_to="none", learning_rate=1e-4, max_steps=1, **config)
    trainer = MDLMTrainer(model, args, data_collator=collator)
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    trainer.model_wrapped = trainer.accelerator.prepare_model(trainer.model)
    return trainer


def precision_path(trainer: MDLMTrainer) -> dict[str, Any]:
    """How a timed step computes: accelerate's mixed precision (autocast + fp32 outputs), weights, gradient clipping."""
    weights = sorted({str(p.dtype).removeprefix("torch.") for p in trainer.model.parameters() if p.requires_grad})
    return {"mixed_precision": trainer.accelerator.mixed_precision, "autocast": bool(trainer.accelerator.native_amp),
            "trained_weights": weights, "max_grad_norm": trainer.args.max_grad_norm,
            "fp32_logits_copy": "masked positions only ([1, masked, vocab])" if trainer.accelerator.native_amp else None}


def synchronize(device: torch.device) -> None:
    """Wait for queued accelerator work, so a wall-clock reading covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step(trainer: MDLMTrainer, collator: TrimsDataCollator, rows: list[dict]) -> float:
    """Seconds for one optimizer step on ``rows`` masked by ``collator``."""
    synchronize(trainer.args.device)
    start = time.perf_counter()
    batch = collator(rows)
    trainer.training_step(trainer.model_wrapped, batch)
    trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), trainer.args.max_grad_norm)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad()
    synchronize(trainer.args.device)
    return time.perf_counter() - start


def interleaved_steps(trainer: MDLMTrainer, collators: dict[str, TrimsDataCollator],
                      batches: Sequence[list[dict]]) -> dict[str, list[float]]:
    """Step times per collator; one warm-up step each on the first batch, then every batch once per collator, the
    order alternating from batch to batch so that neither always follows the other."""
    for collator in collators.values():
        step(trainer, collator, batches[0])
    times: dict[str, list[float]] = {name: [] for name in collators}
    for index, batch in enumerate(batches):
        names = list(collators)
        for name in names[::-1] if index % 2 else names:
            times[name].append(step(trainer, collators[name], batch))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    args = parser.parse_args()
    rows = prepared_rows(args.steps * args.batch_size, args.length, prompt=64)
    batches = [rows[i:i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=args.length)
    model = prepare_student(LlamaForCausalLM(config), "llada", mask_token_id=_Tokenizer.mask_token_id)
    collators = masking_collators(_Tokenizer(), args.length)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(model, collators["trims"], tmp, use_cpu=True, max_length=args.length)
        times = interleaved_steps(trainer, collators, batches)
    trims_median, mdlm_median = statistics.median(times["trims"]), statistics.median(times["mdlm"])
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
