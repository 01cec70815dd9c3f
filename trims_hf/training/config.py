"""MDLMConfig: TrainingArguments plus every MDLM/TRIMS setting, with the paper's defaults.

The TRIMS settings are not re-declared here: ``MDLMConfig`` inherits the fields of
:class:`~trims_hf.settings.MaskingConfig` (buckets and masking) and :class:`~trims_hf.settings.StudentFormat`
(prompt rendering, end of response, max length), and hands each consumer its part with :meth:`masking`
and :meth:`student_format`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from transformers import TrainingArguments

from ..settings import MaskingConfig, StudentFormat, check_field_types, check_seed, settings_of
from ..students.loss import check_normalization

SPLIT = ("per_device_train_batch_size", "gradient_accumulation_steps")
"""How a global batch is split; MDLMConfig leaves both unset (None) until ``__post_init__`` fills in transformers'
defaults, so a value the user gives, even the default one, is told apart from none: ``global_batch_size`` chooses
them itself and refuses either."""


@dataclass
class MDLMConfig(TrainingArguments, MaskingConfig, StudentFormat):
    """Training arguments for :class:`trims_hf.MDLMTrainer` (paper §4: K=8, p_context 0.05, p_future 0.95, ratio 0.1)."""

    loss_normalization: str = field(
        default="token",
        metadata={"help": "token: divide by the response tokens of the whole accumulated (and all-device) batch; "
                  "sequence: average per-sequence losses, each divided by its own response length.",
                  "choices": ["token", "sequence"]},
    )
    prediction_loss_only: bool = field(
        default=True, metadata={"help": "Kept True: evaluation needs only the loss, never the [B, L, vocab] logits."}
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "False: a plain transformers Trainer would drop the prepared columns the collator "
                                 "reads (MDLMTrainer keeps them either way)."}
    )
    compile_blocks: bool = field(
        default=False,
        metadata={"help": "Compile each decoder block in place with torch.compile (one graph serves every layer): fuses "
                          "the norms, rotary, SwiGLU and LoRA's elementwise work into fewer kernels. Each new batch shape "
                          "compiles once (about a minute for an 8B block), so it pays off over long runs."},
    )

    per_device_train_batch_size: int | None = field(
        default=None,
        metadata={"help": "Rows per device in each micro-batch; transformers' default (8) when unset. Left unset with "
                          "global_batch_size, which chooses it."},
    )
    gradient_accumulation_steps: int | None = field(
        default=None,
        metadata={"help": "Micro-batches accumulated into one optimizer step; transformers' default (1) when unset. "
                          "Left unset with global_batch_size, which chooses it."},
    )
    global_batch_size: int | None = field(
        default=None,
        metadata={"help": "Rows per optimizer step over every process. When set, per_device_train_batch_size and "
                          "gradient_accumulation_steps are chosen for it before training: the largest per-device batch "
                          "dividing global_batch_size / processes whose forward and backward at max_length fit in "
                          "memory (tried from the largest down), and the accumulation that makes up the rest; so those "
                          "two are left unset. The objective is the same for every split (padding: max_length)."},
    )

    def __post_init__(self) -> None:
        given = [name for name in SPLIT if getattr(self, name) is not None]
        for name in SPLIT:
            if getattr(self, name) is None:
                setattr(self, name, TrainingArguments.__dataclass_fields__[name].default)
        check_field_types(self, MDLMConfig)
        check_normalization(self.loss_normalization)
        self._check_precision()
        TrainingArguments.__post_init__(self)
        MaskingConfig.__post_init__(self)
        StudentFormat.__post_init__(self)
        self._check_optimisation()
        if self.global_batch_size is not None:
            self._check_global_batch(given)

    def _check_precision(self) -> None:
        """bf16 without a device that trains in it, said in the settings' terms with both ways out (transformers says
        "Your setup doesn't support bf16/gpu" and names neither the setting nor fp32); tested with transformers' own
        helpers, so the two never disagree."""
        from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

        for name in ("bf16", "bf16_full_eval"):
            if getattr(self, name) and not self.use_cpu and not is_torch_bf16_gpu_available() \
                    and not is_torch_xla_available():
                raise ValueError(f"{name}=True: this machine has no GPU that computes in bf16; set {name}=False to run "
                                 "here without bf16 mixed precision (the weights keep the dtype they load in), or "
                                 "use_cpu=True to run in bf16 on the CPU.")

    def _check_optimisation(self) -> None:
        """What ``TrainingArguments`` accepts and training then fails on (a DataLoader, a division, the optimizer, a
        seed numpy refuses) or runs otherwise than asked, refused before anything loads: batch sizes and accumulation
        below 1, a learning rate that is not a positive finite number, no epochs without ``max_steps`` (transformers
        trains ``num_train_epochs`` unless ``max_steps > 0``: 0 would save an untrained adapter), a ``max_steps`` of 0
        or below -1 (the epochs would run instead), a NaN or negative ``max_grad_norm`` (clipping silently off), a
        negative ``weight_decay``, a negative ``dataloader_num_workers`` (PyTorch's DataLoader refuses it only once
        training starts), seeds outside numpy's range, Adam's betas outside [0, 1) and a NaN or negative epsilon
        (the optimizer refuses them once the model is loaded), and a label smoothing the MDLM loss never applies."""
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be at least 1.")
        if not 0 < self.learning_rate < math.inf:  # NaN fails too
            raise ValueError(f"learning_rate={self.learning_rate}: must be a finite number > 0 (0 would train nothing).")
        if self.max_steps == 0 or self.max_steps < -1:  # transformers trains the epochs for any max_steps <= 0
            raise ValueError(f"max_steps={self.max_steps}: a number of optimizer steps > 0, or -1 (the default) to train "
                             "num_train_epochs.")
        if not 0 <= self.max_grad_norm < math.inf:  # NaN would turn clipping off without a word
            raise ValueError(f"max_grad_norm={self.max_grad_norm}: must be a finite number >= 0 (0: no clipping).")
        if not 0 <= self.weight_decay < math.inf:
            raise ValueError(f"weight_decay={self.weight_decay}: must be a finite number >= 0.")
        if self.dataloader_num_workers < 0:
            raise ValueError(f"dataloader_num_workers={self.dataloader_num_workers}: must be at least 0 (0 loads the "
                             "batches in the training process).")
        check_seed("seed", self.seed)
        check_seed("data_seed", self.data_seed)
        if self.max_steps <= 0 and not 0 < self.num_train_epochs < math.inf:
            raise ValueError(f"num_train_epochs={self.num_train_epochs}: must be a finite number > 0 unless max_steps > 0 "
                             f"(max_steps {self.max_steps} leaves the length to the epochs); 0 would train nothing.")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:  # NaN fails too
                raise ValueError(f"{name}={getattr(self, name)}: must be in [0, 1).")
        if not 0 <= self.adam_epsilon < math.inf:
            raise ValueError(f"adam_epsilon={self.adam_epsilon}: must be a finite number >= 0.")
        if self.label_smoothing_factor != 0:  # the MDLM objective is its own cross-entropy; the Trainer's smoother never runs
            raise ValueError(f"label_smoothing_factor={self.label_smoothing_factor}: the MDLM loss has no label "
                             "smoothing, so it would change nothing; leave it at 0.")

    def _check_global_batch(self, given: list[str]) -> None:
        """What cannot go with a searched split, refused before anything loads: a split given as well (it would be
        replaced), transformers' own search (it shrinks the global batch on out-of-memory), a DeepSpeed config given
        here (filled in with the split before the search changes it; accelerate's config is filled after), an
        optimizer built from the model (its states cannot be measured), and sharded parameters (the probe runs the
        whole model on one device)."""
        name = f"global_batch_size {self.global_batch_size}"
        if self.global_batch_size < 1:
            raise ValueError(f"{name}: must be at least 1.")
        if given:
            raise ValueError(f"{name} chooses {' and '.join(given)} itself (the largest per-device batch that fits); "
                             f"give one or the other (global_batch_size: null in a recipe or --global_batch_size null on "
                             f"the command line, or leave {' and '.join(given)} out).")
        if self.auto_find_batch_size:
            raise ValueError(f"{name} with auto_find_batch_size: transformers' search would shrink the global batch "
                             "after an out-of-memory error; use one of them.")
        if self.deepspeed:
            raise ValueError(f"{name} with deepspeed {self.deepspeed}: launch DeepSpeed through accelerate's config "
                             "(recipes/accelerate/zero2.yaml), which is filled in after the search.")
        from .batch_search import check_measurable  # torch and the students: only when a search is asked for

        check_measurable(self.optim)
        if self.fsdp or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true") or \
                os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
            raise ValueError(f"{name} under FSDP or ZeRO-3: the search probes the whole model on one device; set the "
                             "split yourself (per_device_train_batch_size, gradient_accumulation_steps).")

    @property
    def rows_per_step(self) -> int:
        """Rows in one optimizer step over every process: ``global_batch_size``, or the split it was given as."""
        return self.global_batch_size or self.per_device_train_batch_size * self.gradient_accumulation_steps * \
            self.world_size

    def masking(self) -> MaskingConfig:
        """The bucket and masking settings, for the collator and the data preparation."""
        return settings_of(self, MaskingConfig)

    def student_format(self) -> StudentFormat:
        """How scored rows become student tokens."""
        return settings_of(self, StudentFormat)
