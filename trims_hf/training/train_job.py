"""``trims train`` logic: the parsed recipe (:mod:`trims_hf.commands.recipe`) -> student, LoRA, data, MDLMTrainer, run.

A recipe is one flat YAML mapping whose keys are the fields of :class:`ModelArguments`,
:class:`DataArguments` and :class:`trims_hf.MDLMConfig` (every ``TrainingArguments`` field plus the
TRIMS knobs). Command-line overrides use the same names. Unknown keys are errors, so a typo never
silently trains with a default.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from datasets import Dataset
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    PreTrainedConfig,
    TrainerCallback,
    set_seed,
)
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..data.hub import check_push_access, load_source_dataset
from ..data.preparation import is_prepared
from ..data.schema import COMPLETION, MESSAGES, PROMPT, SchemaError, has_teacher_scores
from ..distributed import announce, name_cpu_accelerator
from ..errors import InputError, check_apart, check_output_path, one_line
from ..evaluation.evaluate import check_task_inputs, load_examples, longest_prompt_past
from ..evaluation.tasks import CodeExecutionDisabled, get_task
from ..model_config import (
    ModelConfig,
    ResolvedStudent,
    check_model_sources,
    load_model,
    resolve_student,
)
from ..prompts import check_end_of_response
from ..reports import write_atomic
from ..settings import DecodingConfig, check_field_types, check_masking_read
from ..sources import SourceError, check_dataset_source, hub_commit
from ..students import STUDENTS, check_sequence_length, get_lora_model, prepare_student, student_config, student_positions
from .batch_search import rows_per_process
from .callbacks import DecodeEvalCallback
from .config import MDLMConfig
from .lora import lora_config
from .model_card import trims_model_card
from .trainer import MDLMTrainer


@dataclass
class ModelArguments(ModelConfig):
    """Which student to train (:class:`~trims_hf.model_config.ModelConfig`) and how to wrap it (paper: LoRA r = 32,
    alpha = 32)."""

    init_from_config: bool = field(
        default=False,
        metadata={"help": "Build the student with random weights from the transformers config at model_name_or_path "
                  "(toy runs and smoke tests; no weights are read)."},
    )
    use_lora: bool = field(
        default=True,
        metadata={"help": "Train a LoRA adapter (paper; with adapter set, that adapter) instead of all weights."},
    )
    lora_r: int = field(default=32, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout (the paper does not state one)."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "Module names LoRA wraps; default: every attention and MLP projection."}
    )

    def __post_init__(self) -> None:
        """The LoRA values peft would reject, or take and train nothing with, refused before the model loads (the
        target modules' names are checked against the model when it is wrapped, :func:`wrap_lora`)."""
        super().__post_init__()
        check_field_types(self, ModelArguments)
        if self.lora_r < 1:
            raise ValueError(f"lora_r={self.lora_r}: the adapter's rank must be at least 1.")
        if not self.lora_alpha > 0:
            raise ValueError(f"lora_alpha={self.lora_alpha}: must be > 0 (alpha / r scales the adapter's update; 0 would "
                             "train nothing).")
        if not 0 <= self.lora_dropout < 1:  # NaN fails too
            raise ValueError(f"lora_dropout={self.lora_dropout}: must be in [0, 1).")
        targets = self.lora_target_modules
        if targets is not None and not (isinstance(targets, list) and targets and
                                        all(isinstance(name, str) and name for name in targets)):
            raise ValueError(f"lora_target_modules={targets!r}: must be a list of module names (e.g. q_proj v_proj).")


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
        try:
            values = (yaml.safe_load(self.decode_eval_decoding) if isinstance(self.decode_eval_decoding, str)
                      else self.decode_eval_decoding)
        except yaml.YAMLError:
            raise InputError(f"decode_eval_decoding {self.decode_eval_decoding}: not a YAML/JSON mapping.") from None
        if values is not None and not isinstance(values, dict):
            raise InputError(f"decode_eval_decoding must be a mapping of decoder settings, got {values!r}.")
        known = {f.name for f in dataclasses.fields(DecodingConfig)}
        unknown = sorted(set(values or {}) - known)
        if unknown:
            raise InputError(f"decode_eval_decoding: unknown decoder setting(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}.")
        try:
            return DecodingConfig(**(values or {}))
        except (TypeError, ValueError) as error:
            raise InputError(f"decode_eval_decoding: {one_line(error)}") from None


def check_student_length(student: ResolvedStudent, model_args: ModelArguments, args: MDLMConfig) -> None:
    """``max_length`` fits the student's position embeddings (its config alone, no weights)."""
    try:
        check_sequence_length(student.config, student.kind, args.max_length)
    except ValueError as error:
        raise InputError(f"{error} (model_name_or_path {model_args.model_name_or_path}).") from None


def check_decode_eval_fits(student: ResolvedStudent, data_args: DataArguments) -> None:
    """The decode-and-grade evaluation's prompts, with its ``gen_length``, fit the student's positions (its config and
    tokenizer alone, before any weight is read)."""
    task = get_task(data_args.decode_eval_task)
    examples = load_examples(task, data_args.decode_eval_data_file, data_args.decode_eval_limit)
    decoding = data_args.decoding_config()
    if problem := longest_prompt_past(student_positions(student.config, student.kind), task, examples,
                                      student.tokenizer, decoding.gen_length):
        raise InputError(f"decode_eval_task {task.name}: {problem}; set a smaller gen_length in "
                         "decode_eval_decoding (e.g. '{gen_length: 64}').")


def build_student(model_args: ModelArguments, student: ResolvedStudent) -> nn.Module:
    """Load (or, with ``init_from_config``, randomly initialise) the student, marked and bidirectional; a given
    adapter stays trainable when LoRA is trained, else it is merged."""
    if not model_args.init_from_config:
        return load_model(model_args, student, train_adapter=model_args.use_lora)
    kwargs = model_args.from_pretrained_kwargs()
    if kwargs["dtype"] == "auto":  # random weights have no checkpoint dtype to follow
        del kwargs["dtype"]
    config = student_config(student.config, student.kind)  # an original LLaDA/Dream config translated: no remote code
    if type(config) is PreTrainedConfig:  # a transformers config.json: its own class
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision,
                                            trust_remote_code=False)
    spec = STUDENTS[student.kind]
    if spec.model_class is not None:  # a family with its own class (LLaDA 2.x's fused QKV), not the auto class's
        model = spec.model_class._from_config(config, **kwargs)
    else:
        model = (AutoModelForCausalLM if spec.decoder else AutoModelForMaskedLM).from_config(config, **kwargs)
    return prepare_student(model, student.kind, student.mask_token_id)


def wrap_lora(model: nn.Module, model_args: ModelArguments, activation_checkpointing: bool) -> nn.Module:
    if not model_args.use_lora:
        return model
    if activation_checkpointing:
        model.enable_input_require_grads()  # frozen embeddings would otherwise cut the checkpointed graph
    if model_args.adapter:  # build_student loaded it trainable
        return model
    if model_args.lora_target_modules is not None:
        check_target_modules(model, model_args.lora_target_modules)
    config = lora_config(model, r=model_args.lora_r, lora_alpha=model_args.lora_alpha,
                         lora_dropout=model_args.lora_dropout, target_modules=model_args.lora_target_modules)
    return get_lora_model(model, config)


def check_target_modules(model: nn.Module, targets: list[str]) -> None:
    """Every name in ``lora_target_modules`` names modules of the student, as peft matches them (the full name or
    its last parts): peft fails only when no name matches, and otherwise wraps the rest silently. The names are the
    built model's, so this runs once it is built, before anything is written."""
    names = [name for name, _ in model.named_modules()]
    missing = [target for target in targets if not any(name == target or name.endswith(f".{target}") for name in names)]
    if missing:
        linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)})
        raise InputError(f"lora_target_modules {' '.join(missing)}: no module of the student has that name; its linear "
                         f"layers are {', '.join(linear)}.")


def hyperparameters(model_args: ModelArguments, data_args: DataArguments, args: MDLMConfig) -> dict[str, dict[str, Any]]:
    """Every setting that defines a TRIMS run, grouped for the model card."""
    world = args.world_size
    optimisation = {
        "learning_rate": args.learning_rate, "lr_scheduler_type": args.lr_scheduler_type,
        "warmup_steps": args.warmup_steps, "weight_decay": args.weight_decay, "num_train_epochs": args.num_train_epochs,
        "max_steps": args.max_steps, "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps, "num_devices": world,
        "global_batch_size": args.rows_per_step,
        "bf16": args.bf16, "seed": args.seed,
    }
    lora = {"use_lora": model_args.use_lora, **({"adapter": model_args.adapter} if model_args.adapter else {})}
    if model_args.use_lora and not model_args.adapter:
        lora |= {"r": model_args.lora_r, "alpha": model_args.lora_alpha, "dropout": model_args.lora_dropout,
                 "target_modules": model_args.lora_target_modules or "attention + MLP projections"}
    return {
        "TRIMS": dataclasses.asdict(args.masking()) | {"loss_normalization": args.loss_normalization,
                                                        "max_length": args.max_length},
        "optimisation": optimisation,
        "LoRA": lora,
    }


RUN_FILE = "trims_run.json"
"""What each checkpoint records of the settings that define its run (:func:`run_definition`), compared on resume."""
RUN_FORMAT = 1
"""The shape of :data:`RUN_FILE`; a file of another format is compared on the settings both name."""

MAY_CHANGE_ON_RESUME = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_devices", "max_steps",
                        "num_train_epochs")
"""Settings a resumed run may change: how the global batch is split (the objective is the same for every split, and
another machine may fit another one) and the run's length (transformers' way to extend a run)."""

CARD_NAMES = {"r": "lora_r", "alpha": "lora_alpha", "dropout": "lora_dropout", "target_modules": "lora_target_modules"}
"""The model card's names of settings whose recipe keys differ."""


def run_definition(model_args: ModelArguments, data_args: DataArguments, args: MDLMConfig) -> dict[str, Any]:
    """The settings that define a run, by recipe key, as JSON reads them back: the model card's hyperparameters, the
    student and the data (local paths resolved, so a resume from another working folder names the same ones). A run
    resumed under others would continue another run's optimizer state, and its card would describe neither."""
    def where(name_or_path: str | None) -> str | None:
        return str(Path(name_or_path).resolve()) if name_or_path and Path(name_or_path).exists() else name_or_path

    card = hyperparameters(model_args, data_args, args)
    settings = {CARD_NAMES.get(name, name): value for group in card.values() for name, value in group.items()
                if name not in MAY_CHANGE_ON_RESUME}
    settings |= {"model_name_or_path": where(model_args.model_name_or_path), "model_revision": model_args.model_revision,
                 "init_from_config": model_args.init_from_config, "dataset_name": where(data_args.dataset_name),
                 "train_split": data_args.train_split}
    return json.loads(json.dumps(settings, default=str))


class RecordRunCallback(TrainerCallback):
    """Writes :data:`RUN_FILE` into every checkpoint, where transformers writes the checkpoint's files (``should_save``:
    the main process, or each node's with ``save_on_each_node``); ``on_save`` comes after the save."""

    def __init__(self, definition: dict[str, Any]) -> None:
        self.definition = definition

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.should_save:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            write_atomic(folder / RUN_FILE, json.dumps({"format": RUN_FORMAT, "settings": self.definition}, indent=1))


def _read_json(path: Path, checkpoint: str) -> Any:
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise InputError(f"resume_from_checkpoint {checkpoint}: {path.name} is not JSON ({one_line(error)}).") from None


def check_resume(checkpoint: str, definition: dict[str, Any], args: MDLMConfig) -> None:
    """A resumed run continues the checkpoint's run: the same defining settings (:data:`MAY_CHANGE_ON_RESUME` aside)
    and steps left to train. A checkpoint that records no settings (written by a plain ``Trainer``) is resumed with a
    warning that they were not compared."""
    folder = Path(checkpoint)
    state = _read_json(folder / TRAINER_STATE_NAME, checkpoint)
    if not (folder / RUN_FILE).is_file():
        if args.process_index == 0:
            print(f"warning: {checkpoint} records no settings ({RUN_FILE}): the resumed run's are not compared with its "
                  "run's.", file=sys.stderr)
    else:
        record = _read_json(folder / RUN_FILE, checkpoint)
        recorded = record.get("settings", {}) if isinstance(record, dict) else {}
        names = (recorded.keys() | definition.keys() if record.get("format") == RUN_FORMAT
                 else recorded.keys() & definition.keys())
        shown = {"global_batch_size": "global batch (per_device_train_batch_size x gradient_accumulation_steps x "
                                      "processes)"} if args.global_batch_size is None else {}
        changed = [f"{shown.get(name, name)} ({recorded.get(name)} -> {definition.get(name)})"
                   for name in sorted(names) if recorded.get(name) != definition.get(name)]
        if changed:
            raise InputError(f"resume_from_checkpoint {checkpoint}: its run was trained with other settings: "
                             f"{', '.join(changed)}; resume with the run's settings, or start a new run in another "
                             "output_dir.")
    step = state.get("global_step", 0)
    if args.max_steps > 0 and step >= args.max_steps:
        raise InputError(f"resume_from_checkpoint {checkpoint}: it holds step {step}, and max_steps is {args.max_steps}, "
                         "so nothing is left to train; raise max_steps to train on.")
    epochs = state.get("num_train_epochs")
    if args.max_steps <= 0 and step >= state.get("max_steps", math.inf) and epochs and args.num_train_epochs <= epochs:
        raise InputError(f"resume_from_checkpoint {checkpoint}: its run finished its {epochs} epochs (step {step}), so "
                         "nothing is left to train; raise num_train_epochs to train on.")


def last_checkpoint(output_dir: str) -> str | None:
    """The last ``checkpoint-N`` folder in ``output_dir``; None when it holds none or does not exist."""
    return get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None


def resume_checkpoint(args: MDLMConfig) -> str | None:
    """The checkpoint to resume from: ``resume_from_checkpoint``'s folder, or with ``true`` the last one in ``output_dir``."""
    value = args.resume_from_checkpoint
    if value is None or value.lower() == "false":
        return None
    if value.lower() == "true":
        last = last_checkpoint(args.output_dir)
        if last is None:
            raise InputError(f"resume_from_checkpoint true: output_dir {args.output_dir} holds no checkpoint-N folder.")
        return last
    if not (Path(value) / TRAINER_STATE_NAME).is_file():
        raise InputError(f"resume_from_checkpoint {value}: not a checkpoint folder (no {TRAINER_STATE_NAME}).")
    return value


def check_decode_eval(data_args: DataArguments, args: MDLMConfig) -> None:
    """The decode-and-grade evaluation can run: a known, non-code task, its data at hand, evaluations scheduled."""
    decoding = data_args.decoding_config()
    name = data_args.decode_eval_task
    if not name:
        return
    if decoding.compile_blocks and not args.compile_blocks:  # compiled in place, the blocks would train compiled too
        raise InputError("decode_eval_decoding compile_blocks: the evaluation decodes the model being trained, whose "
                         "blocks it would compile for the rest of the run; set compile_blocks (training) as well.")
    if not data_args.eval_split or args.eval_strategy == "no":
        raise InputError("decode_eval_task runs at each evaluation: set eval_split and eval_strategy (e.g. epoch).")
    try:
        task = get_task(name)
        check_task_inputs(task, data_args.decode_eval_data_file, execute_code=False)
    except KeyError as error:
        raise InputError(f"decode_eval_task {name}: {error.args[0]}.") from None
    except FileNotFoundError:
        raise InputError(f"decode_eval_data_file {data_args.decode_eval_data_file}: no such file.") from None
    except CodeExecutionDisabled:
        raise InputError(f"decode_eval_task {name}: its grading runs model-written code, which trims train does not do; "
                          "evaluate code tasks with `trims eval --allow-code-execution`.") from None
    if data_args.decode_eval_data_file is None:
        check_dataset_source("decode_eval_data_file", task.hub_id, default=task.hub_id)


REPORTING_PACKAGE_CHECK = {"comet_ml": "comet", "azure_ml": "azureml", "flyte": "flytekit"}
"""``report_to`` names whose availability check in transformers is spelled otherwise (``is_<name>_available``)."""


def check_reporting(report_to: list[str | None]) -> None:
    """One line for an unknown ``report_to`` integration, or one whose package is missing (as transformers' own
    ``is_<name>_available`` says): transformers raises only once the model is loaded, when it builds the callback."""
    from transformers.integrations import integration_utils

    names = [name for name in report_to if name not in (None, "none", "all")]
    try:
        integration_utils.get_reporting_integration_callbacks(names)
    except ValueError as error:
        raise InputError(f"report_to {' '.join(names)}: {one_line(error)}") from None
    for name in names:
        available = getattr(integration_utils, f"is_{REPORTING_PACKAGE_CHECK.get(name, name)}_available", None)
        if available is not None and not available():
            raise InputError(f"report_to {name}: its package is not installed here; install it, or set report_to "
                             "none.")


LORA_SETTINGS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
"""The settings only a LoRA run reads."""


def check_overrides_read(model_args: ModelArguments, args: MDLMConfig, given: Iterable[str]) -> None:
    """The recipe keys ``given`` on the command line that the run's other settings leave unread, refused: the user
    believes they change the run. (A recipe's own values stay: a recipe may keep settings another key turns off.)"""
    given = set(given)
    try:
        check_masking_read(args.masking(), given)
    except ValueError as error:
        raise InputError(str(error)) from None
    unread = [f"{name}={getattr(model_args, name)}" for name in LORA_SETTINGS if name in given]
    if unread and not model_args.use_lora:
        them = "them" if len(unread) > 1 else "it"
        raise InputError(f"{', '.join(unread)}: only a LoRA run reads {them}, and use_lora=false trains every weight; "
                         f"drop {them}, or set use_lora=true.")


def check_split_search(args: MDLMConfig) -> None:
    """A split searched by ``trims train`` keeps the objective only where padding does not depend on it (the Python
    API leaves that choice to its caller, as ``MDLMConfig``'s help says)."""
    if args.global_batch_size is not None and args.padding == "longest" and args.train_on_padding:
        raise InputError(f"global_batch_size {args.global_batch_size} with padding=longest: the split it chooses would "
                         "change the loss (each micro-batch's EOS padding is trained on); set padding=max_length, whose "
                         "objective is the same for every split, or train_on_padding=false.")


def check_run(model_args: ModelArguments, data_args: DataArguments, args: MDLMConfig) -> str | None:
    """Every mistake found without loading a model or a data set, in seconds; returns the checkpoint to resume from.

    Local checks come first; the Hub is only probed (write access, the student's and the data set's ids).
    """
    resume = resume_checkpoint(args)
    if resume is not None:
        check_resume(resume, run_definition(model_args, data_args, args), args)
    # A new run never writes into an earlier one: its checkpoints, adapter and card would mix with the old files.
    earlier = last_checkpoint(args.output_dir) is not None
    check_output_path(args.output_dir, f"output_dir {args.output_dir}", existing="reuse" if resume else "empty",
                      advice=", or continue its run with --resume_from_checkpoint true" if earlier else "")
    check_reporting(args.report_to)
    check_split_search(args)
    if args.push_to_hub:  # so a long run never ends in an auth error
        check_push_access(args.hub_model_id or Path(args.output_dir).absolute().name, args.hub_token)
    if model_args.adapter and model_args.init_from_config:
        raise InputError("adapter: an adapter goes on trained weights; init_from_config builds random ones.")
    check_model_sources(model_args)
    check_dataset_source("dataset_name", data_args.dataset_name)
    check_apart(args.output_dir, f"output_dir {args.output_dir}", data_args.dataset_name,
                f"dataset_name {data_args.dataset_name}")
    check_decode_eval(data_args, args)
    if args.global_batch_size is not None:
        rows_per_process(args.global_batch_size, args.world_size, args.n_gpu)
    return resume


def check_columns(dataset: Dataset, source: str, args: MDLMConfig) -> None:
    """The rows hold what the run trains on: text (or prepared student ids), and teacher scores for TRIMS masking."""
    columns = dataset.column_names
    if is_prepared(dataset):
        return
    if not ({PROMPT, COMPLETION} <= set(columns) or MESSAGES in columns):
        raise InputError(f"dataset_name {source}: no '{PROMPT}' and '{COMPLETION}' (or '{MESSAGES}') columns, only "
                          f"{', '.join(columns)}; score it with `trims score --prompt-column ... --completion-column ...`.")
    if args.trajectory_ratio > 0 and not has_teacher_scores(columns, args.metric):
        raise InputError(f"dataset_name {source}: no teacher scores for metric {args.metric} (columns {', '.join(columns)}), "
                          "which trajectory masking needs; score it with `trims score`, or set trajectory_ratio 0 (MDLM).")


def load_data(data_args: DataArguments, args: MDLMConfig) -> tuple[Dataset, Dataset | None]:
    """The train (and eval) split, with the columns the run needs, before any model loads."""
    source = data_args.dataset_name
    loaded: list[Dataset | None] = []
    for key, split in (("train_split", data_args.train_split), ("eval_split", data_args.eval_split)):
        try:
            loaded.append(split and load_source_dataset(source, split, flag="dataset_name"))
        except SourceError:
            raise
        except (FileNotFoundError, ValueError) as error:  # a folder without data files, data files without rows
            raise InputError(f"{key} {split}: cannot load it from dataset_name {source} ({one_line(error)}).") from None
    for dataset in filter(None, loaded):
        check_columns(dataset, source, args)
    return loaded[0], loaded[1]


def prepare_rows(dataset: Dataset | None, key: str, split: str | None, source: str, tokenizer: Any,
                 args: MDLMConfig) -> Dataset | None:
    """A split prepared for the student with its tokenizer alone, so every row check (columns, teacher scores and
    spans, prompt length within max_length) runs before any model loads; MDLMTrainer then finds it prepared."""
    if dataset is None:
        return None
    try:
        return MDLMTrainer.prepare_rows(dataset, tokenizer, args.student_format(), args.masking(), args)
    except SchemaError as error:
        raise InputError(f"dataset_name {source}, {key} {split}: {error}") from None


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``trims train``: the message says which checkpoint holds the work and how to continue."""

    def __init__(self, output_dir: str, step: int, max_steps: int) -> None:
        folder = Path(output_dir)
        last = last_checkpoint(output_dir)
        where = f"interrupted at step {step} of {max_steps}"
        if last is not None:
            message = (f"{where}; {last} holds step {last.rsplit('-', 1)[1]}: continue from it with the same command and "
                       "--resume_from_checkpoint true.")
        elif folder.is_dir() and any(folder.iterdir()):
            message = f"{where}; no checkpoint was saved: delete output_dir {output_dir} (or choose another) and rerun."
        else:
            message = f"{where}; no checkpoint was saved: rerun the same command."
        super().__init__(message)


class _CheckpointOnInterrupt(TrainerCallback):
    """After a first Ctrl-C, end the optimizer step under way, save a checkpoint through the Trainer (weights, optimizer,
    scheduler, RNG and data position, so a resumed run continues exactly) and stop. Every process stops at the
    same step: the request is reduced over them."""

    def __init__(self) -> None:
        self.requested = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        requested = self.requested
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor(float(requested), device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            requested = bool(flag.item())
        if requested:
            self.requested = control.should_save = control.should_training_stop = True

    @contextmanager
    def listening(self) -> Iterator[None]:
        """Route the first Ctrl-C to :meth:`on_step_end`; a second one interrupts at once (nothing more is saved)."""
        if threading.current_thread() is not threading.main_thread():  # only the main thread may handle signals
            yield
            return

        def request(signum: int, frame: Any) -> None:
            self.requested = True
            signal.signal(signal.SIGINT, previous)
            print("interrupt: saving a checkpoint after this step (Ctrl-C again to stop at once)", file=sys.stderr)

        previous = signal.signal(signal.SIGINT, request)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


def train(model_args: ModelArguments, data_args: DataArguments, args: MDLMConfig) -> MDLMTrainer:
    """Check everything, load data and tokenizer, then the student; train (resuming if asked), save, push if asked.

    Ctrl-C raises :class:`TrainingInterrupted` (the first one after saving a checkpoint at the end of the step)."""
    resume = check_run(model_args, data_args, args)
    student = resolve_student(model_args)
    check_student_length(student, model_args, args)
    if data_args.decode_eval_task:
        check_decode_eval_fits(student, data_args)
    check_end_of_response(student.tokenizer, args.end_of_response, "end_of_response", "--end_of_response")
    train_dataset, eval_dataset = load_data(data_args, args)
    tokenizer = student.tokenizer
    train_dataset = prepare_rows(train_dataset, "train_split", data_args.train_split, data_args.dataset_name, tokenizer, args)
    eval_dataset = prepare_rows(eval_dataset, "eval_split", data_args.eval_split, data_args.dataset_name, tokenizer, args)
    if args.rows_per_step > len(train_dataset):  # each step would see the whole data set and no more
        raise InputError(f"global batch {args.rows_per_step} (global_batch_size, or per_device_train_batch_size x "
                         f"gradient_accumulation_steps x {args.world_size} processes) is more than the "
                         f"{len(train_dataset)} training rows of {data_args.dataset_name}: each optimizer step would see "
                         f"{len(train_dataset)}; choose at most {len(train_dataset)}.")
    set_seed(args.seed)
    if args.device.type == "cpu":  # also sets up (once, cached) the processes that distributed_state describes
        name_cpu_accelerator()
    announce("trims train", args.distributed_state)
    model = wrap_lora(build_student(model_args, student), model_args, args.activation_checkpointing)
    trainer = MDLMTrainer(model, args, train_dataset=train_dataset, eval_dataset=eval_dataset, processing_class=tokenizer)
    if data_args.decode_eval_task:
        DecodeEvalCallback(data_args.decode_eval_task, tokenizer, data_args.decoding_config(), limit=data_args.decode_eval_limit,
                           data_file=data_args.decode_eval_data_file, trainer=trainer)
    trainer.add_callback(RecordRunCallback(run_definition(model_args, data_args, args)))
    stop = _CheckpointOnInterrupt()
    trainer.add_callback(stop)
    try:
        with stop.listening():
            result = trainer.train(resume_from_checkpoint=resume)
    except KeyboardInterrupt:
        raise TrainingInterrupted(args.output_dir, trainer.state.global_step, trainer.state.max_steps) from None
    if stop.requested and trainer.state.global_step < trainer.state.max_steps:  # at the last step: the run is done
        raise TrainingInterrupted(args.output_dir, trainer.state.global_step, trainer.state.max_steps)
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_model()  # with push_to_hub, this also uploads the adapter
    trainer.save_state()
    if trainer.is_world_process_zero():
        card = trims_model_card(
            base_model=model_args.model_name_or_path,
            base_model_revision=hub_commit(model_args.model_name_or_path, revision=model_args.model_revision),
            dataset=data_args.dataset_name, hyperparameters=hyperparameters(model_args, data_args, args),
            log_history=trainer.state.log_history, model_kind=model_args.model_kind,
            mask_token_id=model_args.mask_token_id, model_name=trainer.hub_model_id or args.output_dir,
            decoding=data_args.decoding_config() if data_args.decode_eval_task else None,
            eval_data_file=data_args.decode_eval_data_file, positions=student_positions(student.config, student.kind),
        )
        card.save(Path(args.output_dir) / "README.md")
        if args.push_to_hub:
            card.push_to_hub(trainer.hub_model_id, token=args.hub_token)  # replaces the Trainer's generic card
    return trainer


__all__ = ["DataArguments", "ModelArguments", "TrainingInterrupted", "check_overrides_read", "check_run", "load_data",
           "train"]
