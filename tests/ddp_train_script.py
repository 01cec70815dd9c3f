"""Train a tiny student for a few steps on fixed pre-noised batches; run by tests/test_distributed.py.

Usage: ``python tests/ddp_train_script.py OUT PER_DEVICE_BATCH`` or the same under ``accelerate launch`` (DDP, or
DeepSpeed with ``--config_file recipes/accelerate/zero2.yaml``). Each rank writes ``OUT/rank<i>.pt`` (flat weights
before and after, losses, world size, ZeRO stage or None).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from datasets import Dataset

from conftest import noised_batch, synthetic_scored_rows, tiny_student
from helpers_tokenizers import make_tokenizer
from test_train_cli import arithmetic_rows
from test_trainer import FixedBatches
from trims_hf import MDLMConfig, MDLMTrainer

GLOBAL_BATCH, STEPS = 8, 3


def main(out: Path, per_device: int) -> None:
    rows = arithmetic_rows(GLOBAL_BATCH * STEPS)
    tokenizer = make_tokenizer([r["prompt"] + "\n" + r["completion"] for r in rows], vocab_size=300)
    batch = noised_batch(tokenizer, synthetic_scored_rows(rows, tokenizer), seed=5, trajectory_ratio=0.3)
    args = MDLMConfig(output_dir=str(out), per_device_train_batch_size=per_device, max_steps=STEPS, logging_steps=1,
                      learning_rate=1e-2, optim="adamw_torch", lr_scheduler_type="constant", save_strategy="no",
                      report_to="none", use_cpu=True, seed=0, disable_tqdm=True, train_sampling_strategy="sequential")
    model = tiny_student(tokenizer, "llada", seed=1)
    initial = torch.cat([p.detach().flatten() for p in model.parameters()])
    trainer = MDLMTrainer(model, args, data_collator=FixedBatches(batch),
                          train_dataset=Dataset.from_dict({"row": list(range(len(rows)))}))
    trainer.train()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    zero_stage = trainer.model_wrapped.zero_optimization_stage() if trainer.is_deepspeed_enabled else None
    torch.save({"initial": initial, "weights": weights, "losses": losses, "world_size": args.world_size,
                "zero_stage": zero_stage}, out / f"rank{args.process_index}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
