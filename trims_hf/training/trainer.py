"""MDLMTrainer: the masked-diffusion ELBO loss (standard MDLM or TRIMS) on top of transformers' Trainer.

It knows the loss (:mod:`trims_hf.students.loss`, shared with the plain ``Trainer`` path) and the student spec, nothing
of how buckets were made. The normaliser covers every micro-batch of an optimizer step (and every device
when ``average_tokens_across_devices``, the default; otherwise per-device losses are averaged), and a row's
masks do not depend on its batch-mates, so per-device batch 8 x GA 4 trains the same objective as batch
32 x GA 1 whenever the EOS padding does not depend on the split either (``padding="max_length"``, or
``train_on_padding=False``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import ProgressCallback

from ..data import schema
from ..data.preparation import bucket_count, is_prepared, longest_row, prepare_dataset
from ..distributed import name_cpu_accelerator
from ..settings import MaskingConfig, StudentFormat
from ..students import compile_blocks, mask_token_id, student_spec
from ..students.adapters import BASE_FINGERPRINT, training_base_fingerprint, write_base_fingerprint
from ..students.loss import check_normalization, masked_token_loss, normaliser, per_unit_loss
from ..students.registry import check_batch_length, check_positions, model_positions
from .batch_search import fit_global_batch, optimizer_spec
from .collator import INPUT_COLUMNS, TrimsDataCollator
from .config import MDLMConfig
from .masked_forward import masked_logits

logger = logging.getLogger(__name__)

_METRIC_SUMS = ("mask_ratio", "samples", "trajectory", "loss_traj", "tokens_traj", "loss_std", "tokens_std")


class CollatorEpochCallback(TrainerCallback):
    """Tell a :class:`TrimsDataCollator` the epoch before each epoch's batches are drawn, so every epoch draws fresh
    masks (and a resumed run the same ones). MDLMTrainer adds it; a plain ``Trainer`` takes it in ``callbacks``."""

    def __init__(self, collator: TrimsDataCollator) -> None:
        self.collator = collator
        collator.follow_epochs()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.collator.epoch = int(math.floor(state.epoch + 1e-6)) if state.epoch else 0


class NumericProgressCallback(ProgressCallback):
    """The progress bar's log lines with numbers as numbers (``'loss': 2.447``): transformers' own callback writes
    every float as a formatted string (``'loss': '2.447'``), which reads as text in a log and parses as one."""

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if state.is_world_process_zero and self.training_bar is not None:
            shown = {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in (logs or {}).items()}
            shown.pop("total_flos", None)
            self.training_bar.write(str(shown))


def with_numeric_logs(trainer: Trainer) -> Trainer:
    """``trainer`` with :class:`NumericProgressCallback` in place of transformers' progress callback (if it has one)."""
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(NumericProgressCallback)
    return trainer


class MDLMTrainer(Trainer):
    """Trainer for masked diffusion LMs with TRIMS trajectory masking.

    Like TRL's SFTTrainer, it prepares scored (or plain prompt/completion) data sets once for the student
    (:func:`trims_hf.prepare_dataset` with ``args``' prompt format, max length and bucket settings) unless
    they are prepared already, and builds a :class:`TrimsDataCollator` from ``args`` when none is given.
    Works with plain ``TrainingArguments`` too (the paper's defaults, token normalisation).
    """

    loss_is_scaled_for_ga = True
    _tag_names = ["trims", "mdlm", "masked-diffusion"]

    def __init__(
        self,
        model: nn.Module,
        args: TrainingArguments | None = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        **kwargs: Any,
    ) -> None:
        args = args if args is not None else MDLMConfig(output_dir="trims-output")
        if not torch.accelerator.is_available():  # DeepSpeed, imported by accelerate, would say it found no GPU
            name_cpu_accelerator()
        self.student = student_spec(model)
        self._fingerprinted, self._base_fingerprint = model, training_base_fingerprint(model)  # before probe or shard
        masking = args.masking() if isinstance(args, MDLMConfig) else MaskingConfig()
        fmt = args.student_format() if isinstance(args, MDLMConfig) else StudentFormat()
        if data_collator is None:
            if processing_class is None:
                raise ValueError("MDLMTrainer needs a data_collator or a processing_class (the student tokenizer).")
            data_collator = TrimsDataCollator(processing_class, mask_token_id=mask_token_id(model), masking=masking,
                                              max_length=fmt.max_length, seed=args.seed)
        if isinstance(getattr(data_collator, "masking", None), MaskingConfig):
            masking = data_collator.masking  # the collator's buckets are the ones trained: rows are cut for them
        self.positions = positions = model_positions(model)  # of the model itself, before any engine wraps it
        if getattr(getattr(data_collator, "masking", None), "padding", None) == "max_length":  # every batch this long
            check_positions(data_collator.max_length, positions)
        train_dataset = self.prepare_rows(train_dataset, processing_class, fmt, masking, args)
        eval_dataset = (
            {name: self.prepare_rows(split, processing_class, fmt, masking, args) for name, split in eval_dataset.items()}
            if isinstance(eval_dataset, dict) else self.prepare_rows(eval_dataset, processing_class, fmt, masking, args)
        )
        splits = {"train_dataset": train_dataset, **(eval_dataset if isinstance(eval_dataset, dict)
                                                     else {"eval_dataset": eval_dataset})}
        for name, split in splits.items():  # before training; rows of other forms are checked batch by batch
            if is_prepared(split) and hasattr(split, "data"):
                longest = longest_row(split)
                check_positions(longest, positions, f"{name}: a row of {longest} tokens (rows are prepared up to "
                                                    "max_length)")
        self.loss_normalization = getattr(args, "loss_normalization", "token")
        check_normalization(self.loss_normalization)
        if getattr(args, "global_batch_size", None) is not None:  # eager: compiled, each probed shape would compile
            built = (kwargs.get("optimizers") or (None, None))[0]
            fit_global_batch(model, args, args.global_batch_size, args.max_length,
                             optimizer_spec(args, kwargs.get("optimizer_cls_and_kwargs"), built))
        if getattr(args, "compile_blocks", False):
            compile_blocks(model)
        super().__init__(
            model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
            eval_dataset=eval_dataset, processing_class=processing_class, **kwargs,
        )
        with_numeric_logs(self)
        # Summed locally at every micro-step; reduced over processes only when logged (one collective per log).
        self._metric_sums: dict[str, torch.Tensor | None] = {"train": None, "eval": None}
        collator_masking = getattr(data_collator, "masking", None)
        if (isinstance(collator_masking, MaskingConfig) and collator_masking.train_on_padding
                and collator_masking.padding == "longest" and args.per_device_train_batch_size > 1
                and (args.gradient_accumulation_steps > 1 or args.world_size > 1)):
            logger.warning("padding='longest' with trained EOS padding: each micro-batch is padded to its own longest "
                           "row, so the loss depends on how the global batch is split; padding='max_length' does not.")
        if isinstance(data_collator, TrimsDataCollator) and not any(
                isinstance(callback, CollatorEpochCallback) for callback in self.callback_handler.callbacks):
            self.add_callback(CollatorEpochCallback(data_collator))

    @staticmethod
    def prepare_rows(dataset: Any, tokenizer: Any, fmt: StudentFormat, masking: MaskingConfig, args: TrainingArguments) -> Any:
        """Scored (or prompt/completion) rows -> student rows, once; other data sets are left to their collator.
        Needs the tokenizer only, so a caller (``trims train``) runs it, and so every row check, before the model loads."""
        if is_prepared(dataset):
            count = bucket_count(dataset, masking.num_buckets) if masking.trajectory_ratio > 0 else None
            if count is not None and count != masking.num_buckets:
                raise schema.SchemaError(
                    f"column '{schema.BUCKET_IDS}': the prepared rows' bucket ids reach {count - 1}, as rows prepared "
                    f"with num_buckets={count} do, but this run trains with num_buckets={masking.num_buckets}; prepare "
                    f"them again with that K (or pass the scored rows, which are prepared for the run), or train with "
                    f"num_buckets={count}.")
            return dataset
        if not set(getattr(dataset, "column_names", None) or ()) & {schema.PROMPT, schema.MESSAGES}:
            return dataset
        if tokenizer is None:
            raise ValueError("MDLMTrainer prepares scored rows for the student: pass processing_class=<student tokenizer>.")
        scored = schema.has_teacher_scores(dataset.column_names, masking.metric)
        if masking.trajectory_ratio > 0 and not scored:
            raise schema.SchemaError(f"The data set has no teacher scores (columns {dataset.column_names}), which trajectory "
                              "masking needs; score it with `trims score`, or set trajectory_ratio=0 for plain MDLM.")
        with args.main_process_first(desc="preparing the data set for the student"):
            return prepare_dataset(dataset, tokenizer, fmt, masking)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """Evaluate with the collator's epoch-0 masks, so eval losses of different epochs are comparable."""
        training_collator = self.data_collator
        if isinstance(training_collator, TrimsDataCollator):
            self.data_collator = dataclasses.replace(training_collator, epoch=0)
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.data_collator = training_collator

    def _set_signature_columns_if_needed(self) -> None:
        # The collator, not the model, reads the data set's columns: keep them all.
        super()._set_signature_columns_if_needed()
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, *INPUT_COLUMNS]))

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> torch.Tensor | None:
        """Count the normaliser over all micro-batches of one optimizer step (and all devices)."""
        if not batch_samples or "masked" not in batch_samples[0]:
            return None
        count = sum(normaliser(batch["labels"], self.loss_normalization) for batch in batch_samples).to(device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            count = self.accelerator.gather(count).sum()
        return count

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        check_batch_length(inputs["input_ids"], self.positions)
        batch = {key: inputs[key] for key in schema.LOSS_KEYS}
        head = None if return_outputs else self.accelerator.unwrap_model(model).get_output_embeddings()
        outputs, token_logits = masked_logits(model, self.student, inputs, head)
        per_unit = per_unit_loss(self.masked_token_loss(token_logits, batch), batch["labels"], self.loss_normalization)
        scaled_across_devices = num_items_in_batch is not None and self.args.average_tokens_across_devices
        if num_items_in_batch is None:
            num_items_in_batch = normaliser(batch["labels"], self.loss_normalization)
        loss = per_unit.sum() / num_items_in_batch
        if scaled_across_devices and self.args.world_size > 1:
            loss = loss * self.accelerator.num_processes  # DDP averages gradients over processes
        self._record_metrics(per_unit.detach(), batch)
        return (loss, outputs) if return_outputs else loss

    def masked_token_loss(self, token_logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Weighted cross-entropy summed over the masked tokens of each sample ([B]) from those tokens' logits
        ([M, vocab], ``batch["masked"].nonzero()`` order, read at the student's source positions): in training the
        head runs on those positions only. Override to change the objective."""
        return masked_token_loss(token_logits, batch["labels"], batch["masked"], batch["loss_weights"])

    @torch.no_grad()
    def _record_metrics(self, per_unit: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        response = (batch["labels"] != schema.IGNORE_INDEX).sum(1).float()
        masked = batch["masked"].sum(1).float()
        trajectory = batch["is_trajectory"].float()
        # The per-kind losses use the same normaliser as the loss: tokens, or sequences (already length-divided).
        units = response if self.loss_normalization == "token" else torch.ones_like(response)
        stats = torch.stack([
            (masked / response.clamp(min=1)).sum(),
            torch.tensor(float(len(response)), device=response.device),
            trajectory.sum(),
            (per_unit * trajectory).sum(),
            (units * trajectory).sum(),
            (per_unit * (1 - trajectory)).sum(),
            (units * (1 - trajectory)).sum(),
        ])
        mode = "train" if self.model.training else "eval"
        previous = self._metric_sums[mode]
        self._metric_sums[mode] = stats if previous is None else previous + stats

    def _pop_metrics(self, mode: str) -> dict[str, float]:
        """Reduce the statistics summed since the last log over processes (all of them log together) and reset."""
        stats, self._metric_sums[mode] = self._metric_sums[mode], None
        if stats is None:
            return {}
        if self.accelerator.num_processes > 1:
            stats = self.accelerator.reduce(stats, reduction="sum")
        sums = dict(zip(_METRIC_SUMS, stats.tolist()))
        metrics = {
            "mask_ratio": sums["mask_ratio"] / sums["samples"],
            "trajectory_share": sums["trajectory"] / sums["samples"],
        }
        if sums["tokens_traj"]:
            metrics["loss_trajectory"] = sums["loss_traj"] / sums["tokens_traj"]
        if sums["tokens_std"]:
            metrics["loss_standard"] = sums["loss_std"] / sums["tokens_std"]
        return metrics

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as the Trainer does (the final model and every checkpoint); a LoRA adapter gets its base's fingerprint
        beside it first (taken when the trainer was built: :func:`~trims_hf.students.adapters.training_base_fingerprint`;
        written before a push uploads the folder), so it later refuses a base of other weights. A model whose weights
        were already partitioned when it came (ZeRO-3 under ``zero.Init``) records none and keeps the name check; a
        record an earlier run left in the folder is removed, as it is not this adapter's. A model set on the trainer
        after it was built is sampled when saved."""
        from peft import PeftModel

        model = self.accelerator.unwrap_model(self.model)  # FSDP and DeepSpeed wrap it inside train
        if self.args.should_save and isinstance(model, PeftModel):
            if model is not self._fingerprinted:
                self._fingerprinted, self._base_fingerprint = model, training_base_fingerprint(model)
            record = Path(output_dir or self.args.output_dir) / BASE_FINGERPRINT
            if self._base_fingerprint is not None:
                write_base_fingerprint(record.parent, self._base_fingerprint)
            else:
                record.unlink(missing_ok=True)
        super().save_model(output_dir, _internal_call)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Push during training as the Trainer does, which copies the model's files from the checkpoint into
        ``output_dir`` and uploads that folder: the base's record goes along with the adapter (and an earlier run's
        record there is removed when the checkpoint has none)."""
        record, uploaded = Path(checkpoint_folder) / BASE_FINGERPRINT, Path(self.args.output_dir) / BASE_FINGERPRINT
        if self.is_world_process_zero():
            if record.is_file():
                shutil.copy(record, uploaded)
            else:
                uploaded.unlink(missing_ok=True)
        super()._push_from_checkpoint(checkpoint_folder)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the training statistics (mask ratio, trajectory share, per-kind losses) to the Trainer's logs."""
        metrics = self._pop_metrics("train") if self.model.training else {}
        super().log({**logs, **metrics}, start_time)

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> Any:
        """Evaluate as the Trainer does and add the same statistics, prefixed, to the returned metrics."""
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        output.metrics.update({f"{metric_key_prefix}_{name}": value for name, value in self._pop_metrics("eval").items()})
        return output
