"""bench/real_size.py's zero2 part: one DeepSpeed ZeRO-2 run through the shipped recipe."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
from train_step import synchronize
from transformers import TrainerCallback

from real_size_parts.common import MODEL_NAMES, ROOT, Run, peak_memory, reset_peak_memory
from real_size_parts.train import SEQUENCE_LENGTH, lora_student, student_collators, trainer_settings, training_rows

ZERO2_STEPS = 3


class StepTimer(TrainerCallback):
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
    timer = StepTimer(run.device)
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
               "--num_processes", "1", str(ROOT / "bench" / "real_size.py"), *settings, "--part", "zero2", "--zero2-worker"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: the ZeRO-2 worker failed (exit {result.returncode}):\n{result.stdout[-3000:]}"
                         f"{result.stderr[-3000:]}")
    print(result.stdout.strip(), flush=True)
