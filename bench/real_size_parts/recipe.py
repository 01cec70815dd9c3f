"""bench/real_size.py's recipe part: optimizer steps of the student's s1K recipe as ``trims train`` runs them.

The recipe's YAML goes through ``trims train``'s own parser (:func:`trims_hf.commands.recipe.parse_recipe`); the
student, built at its true shape (no weights can be downloaded on the device), gets the recipe's LoRA from
``trims train``'s :func:`~trims_hf.training.train_job.wrap_lora`; MDLMTrainer then searches the batch
(``global_batch_size``), compiles the blocks (``compile_blocks``) and trains, so every setting is the recipe's but the
run length, the output and the sequence length at tiny scale. The whole s1K run (1,000 rows of 1,024 tokens, 30
epochs) is projected from the measured steps.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from types import SimpleNamespace

from datasets import Dataset

from real_size_parts.common import (
    MODEL_NAMES,
    RECIPE_MFU_MIN,
    RECIPE_MINUTES_MAX,
    ROOT,
    Run,
    build_model,
    device_name,
    flop_convention,
    head_flops_not_run,
    linear_weights,
    peak_memory,
    reset_peak_memory,
    shortfall,
    training_flops_per_token,
)
from real_size_parts.train import SEQUENCE_LENGTH, training_rows
from real_size_parts.zero2 import StepTimer
from trims_hf import MDLMTrainer, TrimsDataCollator, mask_token_id
from trims_hf.commands.recipe import parse_recipe, read_recipe
from trims_hf.students import STUDENTS
from trims_hf.studies.accelerators import accelerator, mfu
from trims_hf.training.train_job import wrap_lora

S1K_ROWS, S1K_EPOCHS = 1000, 30
"""The paper's run: s1K's 1,000 rows, 30 epochs, each row padded to the recipe's max_length."""


def recipe_path(student: str) -> str:
    return str(ROOT / "recipes" / student / "trims_s1k.yaml")


def recipe_part(run: Run) -> None:
    """``run.steps`` optimizer steps of ``recipes/<student>/trims_s1k.yaml``; one line: tokens/s, MFU, the split of
    the global batch, and the projected minutes of the whole s1K run on this device."""
    cuda = run.device.type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        overrides = {"output_dir": tmp, "max_steps": run.steps, "save_strategy": "no", "logging_steps": 1,
                     "report_to": "none", "disable_tqdm": "true", "use_cpu": str(not cuda).lower(),
                     "bf16": str(cuda and str(run.dtype) == "torch.bfloat16").lower()}
        if run.scale == "tiny":  # the tiny student's positions; at real scale the recipe's own max_length
            overrides["max_length"] = SEQUENCE_LENGTH["tiny"]
        model_args, _, args = parse_recipe(recipe_path(run.student), [f"--{key}={value}" for key, value in overrides.items()])
        length = args.max_length
        recipe_saves = read_recipe(recipe_path(run.student)).get("save_strategy", "steps")  # the bench saves nothing
        model = build_model(run.student, run.scale, run.device, run.dtype, run.attn_implementation)
        base_parameters, frozen = model.num_parameters(), linear_weights(model)
        model = wrap_lora(model, model_args, args.activation_checkpointing)
        lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
        config = model.config
        collator = TrimsDataCollator(SimpleNamespace(eos_token_id=config.eos_token_id), mask_token_id=mask_token_id(model),
                                     masking=args.masking(), max_length=length, seed=args.seed)
        global_batch = args.global_batch_size or (args.per_device_train_batch_size * args.gradient_accumulation_steps
                                                  * args.world_size)
        rows = Dataset.from_list(training_rows(run, global_batch * run.steps, length=length))
        masked_fraction = collator(rows.select(range(global_batch)).to_list())["masked"].float().mean().item()
        timer = StepTimer(run.device)
        reset_peak_memory(run.device)
        begin = time.perf_counter()
        trainer = MDLMTrainer(model, args, data_collator=collator, train_dataset=rows, callbacks=[timer])
        search_s = time.perf_counter() - begin  # the batch search's probes run here, once per run
        trainer.train()
    batch, accumulation, processes = args.per_device_train_batch_size, args.gradient_accumulation_steps, args.world_size
    global_batch = batch * accumulation * processes
    steady = statistics.median(timer.times[1:]) if len(timer.times) > 1 else timer.times[0]
    tokens_per_s = global_batch * length / steady
    views = 1 if STUDENTS[run.student].block_size is None else 2
    flops = training_flops_per_token(config, length, frozen, lora, views)
    peak = accelerator(device_name(run.device))
    utilisation = mfu(flops, tokens_per_s, peak) if peak else None
    head_weights = model.get_output_embeddings().weight.numel()
    run_flops = flops - head_flops_not_run(head_weights, views, masked_fraction)
    s1k_tokens = S1K_ROWS * S1K_EPOCHS * length
    first_step_extra = timer.times[0] - steady  # compiling and the allocator's first growth
    minutes = (search_s + first_step_extra + s1k_tokens / tokens_per_s) / 60
    run.emit("recipe", {
        "measurement": "recipe_training", "model": MODEL_NAMES[run.student], "recipe": f"recipes/{run.student}/trims_s1k.yaml",
        "base_parameters": base_parameters, "lora_parameters": lora, "sequence_length": length,
        "global_batch": global_batch, "global_batch_size_setting": args.global_batch_size,
        "per_device_batch": batch, "gradient_accumulation": accumulation, "processes": processes,
        "compile_blocks": args.compile_blocks, "gradient_checkpointing": args.activation_checkpointing,
        "mixed_precision": trainer.accelerator.mixed_precision, "steps": run.steps,
        "step_s": [round(t, 4) for t in timer.times], "median_step_s_after_first": round(steady, 4),
        "tokens_per_s": round(tokens_per_s, 1), "flops_per_token": flops, "flop_convention": flop_convention(views),
        "mfu": round(utilisation, 4) if utilisation else None, "goal_mfu_min": RECIPE_MFU_MIN,
        "masked_fraction": round(masked_fraction, 4), "flops_per_token_run": run_flops,
        "mfu_of_flops_run": round(mfu(run_flops, tokens_per_s, peak), 4) if peak else None,
        "mfu_note": "mfu (the goal's, as the train part's) counts the LM head at every position; mfu_of_flops_run "
                    "only at the masked_fraction of positions MDLMTrainer projects (one global batch of the bench's "
                    "rows collated as the recipe does)",
        "accelerator": peak.name if peak else None,
        "s1k_tokens": s1k_tokens, "batch_search_s": round(search_s, 2),
        "first_step_extra_s": round(first_step_extra, 2),
        "projected_s1k_minutes": round(minutes, 2), "goal_s1k_minutes_max": RECIPE_MINUTES_MAX,
        "projection": f"{S1K_ROWS} rows x {S1K_EPOCHS} epochs x {length} tokens at the median step after the first, "
                      "plus the batch search and the first step's excess (compiling); not the recipe's checkpoint saves "
                      f"(save_strategy {recipe_saves})",
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        **peak_memory(run.device),
        **run.judge(shortfall(utilisation and RECIPE_MFU_MIN / utilisation, minutes / RECIPE_MINUTES_MAX)),
    })
