"""Train a tiny student for a few steps on GSM8K rows of different lengths; run by tests/test_distributed.py.

Usage: ``python tests/ddp_train_script.py OUT PER_DEVICE_BATCH GRADIENT_ACCUMULATION [compiled]`` or the same under
``accelerate launch --multi_gpu --num_processes N`` (DDP) or ``--config_file recipes/accelerate/zero2.yaml``
(DeepSpeed). The real collator pads every batch to max_length and draws each row's masks from the row alone, so
any split of the global batch of 8 sees the same samples. Each rank writes ``OUT/rank<i>.pt``: flat weights
before and after, the training logs, how many metric reductions ran, and the ZeRO stage (None without DeepSpeed).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from conftest import GSM8K_TRAIN, read_jsonl, synthetic_scored_rows, tiny_student
from datasets import Dataset
from helpers_tokenizers import make_tokenizer
from torch._dynamo.utils import counters

from trims_hf import MDLMConfig, MDLMTrainer

GLOBAL_BATCH, STEPS, MAX_LENGTH = 8, 3, 640


def main(out: Path, per_device: int, accumulation: int, compiled: bool = False) -> None:
    rows = [{"prompt": r["question"], "completion": r["answer"]} for r in read_jsonl(GSM8K_TRAIN, GLOBAL_BATCH * STEPS)]
    tokenizer = make_tokenizer([r["prompt"] + "\n" + r["completion"] for r in rows], vocab_size=300)
    args = MDLMConfig(output_dir=str(out), per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation,
                      max_steps=STEPS, logging_steps=1, learning_rate=1e-2, optim="adamw_torch", lr_scheduler_type="constant",
                      save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
                      train_sampling_strategy="sequential", trajectory_ratio=0.3, padding="max_length", max_length=MAX_LENGTH,
                      compile_blocks=compiled)
    model = tiny_student(tokenizer, "llada", seed=1)
    initial = torch.cat([p.detach().flatten() for p in model.parameters()])
    trainer = MDLMTrainer(model, args, train_dataset=Dataset.from_list(synthetic_scored_rows(rows, tokenizer)),
                          processing_class=tokenizer)
    reductions = []
    reduce = trainer.accelerator.reduce
    trainer.accelerator.reduce = lambda *a, **k: reductions.append(trainer.state.global_step) or reduce(*a, **k)
    trainer.train()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    zero_stage = trainer.model_wrapped.zero_optimization_stage() if trainer.is_deepspeed_enabled else None
    compiled_blocks = sum(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())
    compiled_graphs = counters["stats"]["unique_graphs"]  # what dynamo compiled: the compiled blocks ran
    torch.save({"initial": initial, "weights": weights, "logs": logs, "reductions": len(reductions),
                "world_size": args.world_size, "zero_stage": zero_stage, "compiled_blocks": compiled_blocks,
                "compiled_graphs": compiled_graphs},
               out / f"rank{args.process_index}.pt")
    trainer.accelerator.end_training()  # leaves the gloo group before exit, as accelerate asks every script to
    # Then exit without the interpreter's teardown: with DeepSpeed on the CPU a worker thread freed there can still
    # abort a finished rank ("terminate called without an active exception", SIGABRT) on a loaded machine, after
    # everything this script reports is written. What the test checks is in the files above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["compiled"])
