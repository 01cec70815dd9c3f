"""MDLMConfig: TrainingArguments plus every MDLM/TRIMS knob, with the paper's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments


@dataclass
class MDLMConfig(TrainingArguments):
    """Training arguments for :class:`trims_hf.MDLMTrainer` (paper §4: K=8, p_context 0.05, p_future 0.95, ratio 0.1)."""

    max_length: int = field(default=1024, metadata={"help": "Maximum sequence length (prompt + completion + EOS padding)."})
    num_buckets: int = field(default=8, metadata={"help": "K, the number of difficulty buckets in the data set."})
    p_context: float = field(default=0.05, metadata={"help": "Mask probability of context tokens (bucket <= k) in trajectory samples."})
    p_future: float = field(default=0.95, metadata={"help": "Mask probability of future tokens (bucket > k) in trajectory samples."})
    trajectory_ratio: float = field(
        default=0.1, metadata={"help": "Share of samples with trajectory masking; 0 trains the plain MDLM baseline."}
    )
    trajectory_selection: str = field(
        default="per_draw",
        metadata={"help": "per_draw: each sample w.p. ratio at every draw; fixed_subset: a fixed ~ratio subset of examples.",
                  "choices": ["per_draw", "fixed_subset"]},
    )
    trajectory_loss_weight: str = field(
        default="elbo",
        metadata={"help": "Weight of trajectory samples: elbo (the sampled t's 1/t, Algorithm 1), inverse_mask_ratio or none.",
                  "choices": ["elbo", "inverse_mask_ratio", "none"]},
    )
    noise_schedule: str = field(default="linear", metadata={"help": "alpha_t schedule: linear (1 - t) or cosine.", "choices": ["linear", "cosine"]})
    min_t: float = field(default=1e-3, metadata={"help": "t is drawn from U(min_t, 1) so that the 1/t weight stays finite."})
    loss_normalization: str = field(
        default="token",
        metadata={"help": "token: divide by the response tokens of the whole accumulated (and all-device) batch; "
                  "sequence: average per-sequence losses, each divided by its own response length.",
                  "choices": ["token", "sequence"]},
    )
    train_on_padding: bool = field(default=True, metadata={"help": "Attend to, mask and train on EOS padding (LLaDA convention)."})
    bucket_ordering: str = field(
        default="hard_to_easy",
        metadata={"help": "Ordering the data set's bucket ids use; decides the easiest bucket for EOS padding.",
                  "choices": ["hard_to_easy", "easy_to_hard", "random"]},
    )
    prediction_loss_only: bool = field(
        default=True, metadata={"help": "Kept True: evaluation needs only the loss, never the [B, L, vocab] logits."}
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Kept False: the collator needs the text and score columns."}
    )

    def collator_kwargs(self) -> dict[str, Any]:
        """The subset of fields that configure a :class:`trims_hf.TrimsDataCollator`."""
        names = ("max_length", "num_buckets", "p_context", "p_future", "trajectory_ratio", "trajectory_selection",
                 "trajectory_loss_weight", "noise_schedule", "min_t", "train_on_padding", "bucket_ordering")
        return {name: getattr(self, name) for name in names} | {"seed": self.seed}
