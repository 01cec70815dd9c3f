"""``trims train`` logic: a recipe (YAML + ``--key value`` overrides) -> student, LoRA, data, MDLMTrainer, run.

A recipe is one flat YAML mapping whose keys are the fields of :class:`ModelArguments`,
:class:`DataArguments` and :class:`trims_hf.MDLMConfig` (every ``TrainingArguments`` field plus the
TRIMS knobs). Command-line overrides use the same names. Unknown keys are errors, so a typo never
silently trains with a default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from peft import get_peft_model
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer, HfArgumentParser, set_seed

from ..callbacks import DecodeEvalCallback
from ..config import MDLMConfig
from ..hub import check_push_access, load_source_dataset
from ..lora import lora_config
from ..model_card import trims_model_card
from ..settings import DecodingConfig
from ..students import STUDENTS, detect_student_kind, load_student, prepare_student, student_mask_token_id
from ..trainer import MDLMTrainer

DTYPES = ("auto", "bfloat16", "float16", "float32")


class RecipeError(ValueError):
    """A recipe or an override names an unknown key or cannot be read."""


@dataclass
class ModelArguments:
    """Which student to train and how to wrap it (paper: LoRA r = 32, alpha = 32)."""

    model_name_or_path: str = field(metadata={"help": "Student Hub id or local folder (weights, config and tokenizer)."})
    model_kind: str | None = field(
        default=None, metadata={"help": "Student family; default: detected from the config.", "choices": sorted(STUDENTS)}
    )
    mask_token_id: int | None = field(
        default=None, metadata={"help": "Mask token id; default: the student config's, else its tokenizer's mask token."}
    )
    model_revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit) of the student."})
    dtype: str = field(default="auto", metadata={"help": "Weight dtype to load the student in.", "choices": list(DTYPES)})
    attn_implementation: str | None = field(default=None, metadata={"help": "e.g. sdpa, flash_attention_2, eager."})
    init_from_config: bool = field(
        default=False,
        metadata={"help": "Build the student with random weights from the transformers config at model_name_or_path "
                  "(toy runs and smoke tests; no weights are read)."},
    )
    use_lora: bool = field(default=True, metadata={"help": "Train a LoRA adapter (paper) instead of all weights."})
    lora_r: int = field(default=32, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout (the paper does not state one)."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "Module names LoRA wraps; default: every attention and MLP projection."}
    )


@dataclass
class DataArguments:
    """Which scored data set to train on and how to turn it into student tokens."""

    dataset_name: str = field(metadata={"help": "Scored data set: Hub id, local folder, or .jsonl/.json/.parquet file."})
    train_split: str = field(default="train", metadata={"help": "Split to train on."})
    eval_split: str | None = field(default=None, metadata={"help": "Split for the loss evaluation (none by default)."})

    decode_eval_task: str | None = field(
        default=None,
        metadata={"help": "Also decode and grade this task (e.g. gsm8k) at every evaluation, logging eval_<task>_accuracy "
                  "and eval_<task>_tokens_per_step (DecodeEvalCallback); needs eval_split and an eval_strategy."},
    )
    decode_eval_limit: int = field(default=8, metadata={"help": "Number of task examples decoded at each evaluation."})
    decode_eval_data_file: str | None = field(default=None, metadata={"help": "Local file of the task's examples (offline)."})
    decode_eval_decoding: dict | str | None = field(
        default=None,
        metadata={"help": "Decoder of decode_eval_task: a mapping of DecodingConfig fields, e.g. "
                  "{strategy: threshold, threshold: 0.9, cache: dual} (YAML/JSON text on the command line)."},
    )

    def decoding_config(self) -> DecodingConfig:
        """The decode-eval decoder these arguments describe (the paper's defaults for unset fields)."""
        values = yaml.safe_load(self.decode_eval_decoding) if isinstance(self.decode_eval_decoding, str) else self.decode_eval_decoding
        if values is not None and not isinstance(values, dict):
            raise RecipeError(f"decode_eval_decoding must be a mapping of decoder settings, got {values!r}.")
        known = {f.name for f in dataclasses.fields(DecodingConfig)}
        unknown = sorted(set(values or {}) - known)
        if unknown:
            raise RecipeError(f"Unknown decoder setting(s) {unknown} in decode_eval_decoding; known: {sorted(known)}.")
        return DecodingConfig(**(values or {}))


RECIPE_TYPES = (ModelArguments, DataArguments, MDLMConfig)


def recipe_keys() -> set[str]:
    return {f.name for dtype in RECIPE_TYPES for f in dataclasses.fields(dtype) if f.init}


def read_recipe(path: str | Path) -> dict[str, Any]:
    """The YAML mapping of a recipe, with every key checked against the known fields."""
    try:
        recipe = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise RecipeError(f"Cannot read recipe {path}: {error}") from error
    if not isinstance(recipe, dict):
        raise RecipeError(f"Recipe {path} must be a mapping of option names to values.")
    unknown = sorted(set(recipe) - recipe_keys())
    if unknown:
        raise RecipeError(f"Unknown key(s) {', '.join(map(repr, unknown))} in recipe {path} (see `trims train --help-keys`).")
    return recipe


def parse_recipe(path: str | Path, overrides: Sequence[str] = ()) -> tuple[ModelArguments, DataArguments, MDLMConfig]:
    """Parse a recipe plus ``--key value`` overrides into the three argument dataclasses.

    The YAML values become the parser's defaults (strings go through the field's type, as on the command
    line), so the overrides win and every value is validated the same way.
    """
    recipe = read_recipe(path)
    parser = HfArgumentParser(RECIPE_TYPES, prog=f"trims train --config {path}", allow_abbrev=False)
    parser.set_defaults(**recipe)
    for action in parser._actions:  # a key given by the recipe is no longer required on the command line
        if action.dest in recipe:
            action.required = False
    model_args, data_args, training_args, rest = parser.parse_args_into_dataclasses(
        args=list(overrides), return_remaining_strings=True
    )
    if rest:
        raise RecipeError(f"Unknown override(s) {' '.join(rest)} for recipe {path}.")
    return model_args, data_args, training_args


def build_student(model_args: ModelArguments, tokenizer: Any) -> nn.Module:
    """Load (or, with ``init_from_config``, randomly initialise) the student, marked and bidirectional."""
    dtype = model_args.dtype if model_args.dtype == "auto" else getattr(torch, model_args.dtype)
    kwargs = {"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}
    if not model_args.init_from_config:
        return load_student(model_args.model_name_or_path, model_args.model_kind, revision=model_args.model_revision,
                            mask_token_id=model_args.mask_token_id, dtype=dtype, **kwargs)
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    kind = model_args.model_kind or detect_student_kind(config.to_dict())
    auto_class = AutoModelForCausalLM if STUDENTS[kind].decoder else AutoModelForMaskedLM
    model = auto_class.from_config(config, dtype=None if dtype == "auto" else dtype, **kwargs)
    return prepare_student(model, kind, student_mask_token_id(config.to_dict(), kind, model_args.mask_token_id, tokenizer))


def wrap_lora(model: nn.Module, model_args: ModelArguments, gradient_checkpointing: bool) -> nn.Module:
    if not model_args.use_lora:
        return model
    if gradient_checkpointing:
        model.enable_input_require_grads()  # frozen embeddings would otherwise cut the checkpointed graph
    config = lora_config(model, r=model_args.lora_r, lora_alpha=model_args.lora_alpha,
                         lora_dropout=model_args.lora_dropout, target_modules=model_args.lora_target_modules)
    return get_peft_model(model, config)




def hyperparameters(model_args: ModelArguments, data_args: DataArguments, args: MDLMConfig) -> dict[str, dict[str, Any]]:
    """Every setting that defines a TRIMS run, grouped for the model card."""
    world = args.world_size
    optimisation = {
        "learning_rate": args.learning_rate, "lr_scheduler_type": args.lr_scheduler_type,
        "warmup_steps": args.warmup_steps, "weight_decay": args.weight_decay, "num_train_epochs": args.num_train_epochs,
        "max_steps": args.max_steps, "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps, "num_devices": world,
        "global_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * world,
        "bf16": args.bf16, "seed": args.seed,
    }
    lora = {"use_lora": model_args.use_lora}
    if model_args.use_lora:
        lora |= {"r": model_args.lora_r, "alpha": model_args.lora_alpha, "dropout": model_args.lora_dropout,
                 "target_modules": model_args.lora_target_modules or "attention + MLP projections"}
    return {
        "TRIMS": dataclasses.asdict(args.masking()) | {"loss_normalization": args.loss_normalization,
                                                        "max_length": args.max_length},
        "optimisation": optimisation,
        "LoRA": lora,
    }


def train(model_args: ModelArguments, data_args: DataArguments, args: MDLMConfig) -> MDLMTrainer:
    """Build everything from the three argument objects, train (resuming if asked), save, and push if asked."""
    if data_args.decode_eval_task and (not data_args.eval_split or args.eval_strategy == "no"):
        raise RecipeError("decode_eval_task runs at each evaluation: set eval_split and eval_strategy (e.g. epoch).")
    data_args.decoding_config()  # a bad decoder setting fails before any download
    if args.push_to_hub:  # before any download or training, so a long run never ends in an auth error
        check_push_access(args.hub_model_id or Path(args.output_dir).absolute().name, args.hub_token)
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision)
    model = wrap_lora(build_student(model_args, tokenizer), model_args, args.gradient_checkpointing)
    train_dataset = load_source_dataset(data_args.dataset_name, data_args.train_split)
    eval_dataset = load_source_dataset(data_args.dataset_name, data_args.eval_split) if data_args.eval_split else None
    trainer = MDLMTrainer(model, args, train_dataset=train_dataset, eval_dataset=eval_dataset, processing_class=tokenizer)
    if data_args.decode_eval_task:
        DecodeEvalCallback(data_args.decode_eval_task, tokenizer, data_args.decoding_config(), limit=data_args.decode_eval_limit,
                           data_file=data_args.decode_eval_data_file, trainer=trainer)
    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_model()  # with push_to_hub, this also uploads the adapter
    trainer.save_state()
    if trainer.is_world_process_zero():
        card = trims_model_card(
            base_model=model_args.model_name_or_path, base_model_revision=model_args.model_revision,
            dataset=data_args.dataset_name, hyperparameters=hyperparameters(model_args, data_args, args),
            log_history=trainer.state.log_history, model_kind=model_args.model_kind,
            mask_token_id=model_args.mask_token_id, model_name=trainer.hub_model_id or args.output_dir,
            decoding=data_args.decoding_config() if data_args.decode_eval_task else None,
            eval_data_file=data_args.decode_eval_data_file,
        )
        card.save(Path(args.output_dir) / "README.md")
        if args.push_to_hub:
            card.push_to_hub(trainer.hub_model_id, token=args.hub_token)  # replaces the Trainer's generic card
    return trainer


def recipe_help() -> str:
    """Every recipe key with its help string (``trims train --help-keys``)."""
    return HfArgumentParser(RECIPE_TYPES, prog="trims train --config FILE", allow_abbrev=False).format_help()


__all__ = ["DataArguments", "ModelArguments", "RecipeError", "parse_recipe", "read_recipe", "recipe_help", "train"]
