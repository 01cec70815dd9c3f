"""MDLMConfig: TrainingArguments plus every MDLM/TRIMS setting, with the paper's defaults.

The TRIMS settings are not re-declared here: ``MDLMConfig`` inherits the fields of
:class:`~trims_hf.settings.MaskingConfig` (buckets and masking) and :class:`~trims_hf.settings.StudentFormat`
(prompt rendering, end of response, max length), and hands each consumer its part with :meth:`masking`
and :meth:`student_format`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

from ..settings import MaskingConfig, StudentFormat, settings_of


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
        default=False, metadata={"help": "Kept False: the collator needs the prepared columns."}
    )
    compile_blocks: bool = field(
        default=False,
        metadata={"help": "Compile each decoder block in place with torch.compile (one graph serves every layer): fuses "
                          "the norms, rotary, SwiGLU and LoRA's elementwise work into fewer kernels. Each new batch shape "
                          "compiles once (about a minute for an 8B block), so it pays off over long runs."},
    )

    global_batch_size: int | None = field(
        default=None,
        metadata={"help": "Rows per optimizer step over every process. When set, per_device_train_batch_size and "
                          "gradient_accumulation_steps are chosen for it before training: the largest per-device batch "
                          "dividing global_batch_size / processes whose forward and backward at max_length fit in "
                          "memory (tried from the largest down), and the accumulation that makes up the rest; the "
                          "values given for those two are replaced. The objective is the same for every split "
                          "(padding: max_length)."},
    )

    def __post_init__(self) -> None:
        TrainingArguments.__post_init__(self)
        MaskingConfig.__post_init__(self)
        StudentFormat.__post_init__(self)

    def masking(self) -> MaskingConfig:
        """The bucket and masking settings, for the collator and the data preparation."""
        return settings_of(self, MaskingConfig)

    def student_format(self) -> StudentFormat:
        """How scored rows become student tokens."""
        return settings_of(self, StudentFormat)
