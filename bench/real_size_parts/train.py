"""bench/real_size.py's train part: LoRA training steps of the student at its true shape (module docstring of
bench/real_size.py)."""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import train_profile
from collator import prepared_rows
from torch import nn
from train_step import build_trainer, interleaved_steps, masking_collators, precision_path, step

from real_size_parts.common import (
    MODEL_NAMES,
    TOKEN_ID_HIGH,
    TRAIN_MFU_MIN,
    TRIMS_OVER_MDLM_MAX,
    Run,
    build_model,
    device_name,
    flop_convention,
    largest_batch,
    linear_weights,
    out_of_memory,
    peak_memory,
    release,
    reset_peak_memory,
    shape,
    stepping_down,
    train_shortfall,
    training_flops_per_token,
)
from trims_hf import TrimsDataCollator, lora_config, mask_token_id
from trims_hf.students import STUDENTS, get_lora_model
from trims_hf.studies.accelerators import accelerator, mfu

SEQUENCE_LENGTH = {"tiny": 256, "real": 1024}
PROMPT_TOKENS = 64


def training_rows(run: Run, count: int, seed: int = 0, length: int | None = None) -> list[dict]:
    """Prepared rows of half to all of ``length`` (default: the scale's sequence length; prompt 64, random buckets);
    batches are padded to it with EOS, as the recipes' ``padding: max_length`` does, so every trained row has it."""
    return prepared_rows(count, length or SEQUENCE_LENGTH[run.scale], PROMPT_TOKENS, seed=seed, high=TOKEN_ID_HIGH)


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
    model = get_lora_model(model, lora_config(model, **extra))
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
                trainer.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
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
                    "flop_convention": flop_convention(views),
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
