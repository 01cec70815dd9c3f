"""TrimsDataCollator: rows of a scored (or prepared) data set -> a noised MDLM training batch.

It knows tokenizers and masking, nothing of models. With ``trajectory_ratio = 0`` it is a plain MDLM
SFT collator (the paper's "MDLM" baseline) and draws exactly the same masks for the same seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from . import schema
from .buckets import MAX_BUCKETS, Ordering, easiest_bucket
from .masking import TrajectoryLossWeight, get_schedule, noise_batch, select_fixed_subset, select_per_draw
from .preparation import StudentFormat, tokenize_example, tokenize_scored_row

# Columns the collator reads; the trainer keeps them when it drops unused dataset columns.
INPUT_COLUMNS = (
    schema.PROMPT, schema.COMPLETION, schema.MESSAGES, *schema.TEACHER_LIST_COLUMNS,
    schema.INPUT_IDS, schema.PROMPT_LENGTH, schema.BUCKET_IDS, schema.EXAMPLE_ID,
)


@dataclass
class TrimsDataCollator:
    """Collate scored rows into noised batches with TRIMS trajectory masking (paper Algorithm 1).

    Rows may be *prepared* (``input_ids``, ``prompt_length``, ``bucket_ids`` from
    :func:`trims_hf.prepare_dataset`) or *raw scored* rows (prompt/completion or messages plus the
    teacher columns), which are tokenised here with the student's chat template and get the teacher's
    bucket ids projected onto student tokens. Plain prompt/completion rows without scores work when
    ``trajectory_ratio == 0``.

    Output keys: ``input_ids`` (noised), ``attention_mask``, ``labels`` (clean ids at masked positions,
    -100 elsewhere), ``response_mask`` (positions counted by the loss normaliser), ``loss_weights``,
    ``t`` and ``is_trajectory`` (per sample).
    """

    tokenizer: Any
    mask_token_id: int | None = None
    """Student mask id; default ``tokenizer.mask_token_id`` (pass ``trims_hf.mask_token_id(model)`` otherwise)."""
    max_length: int = 1024
    """Sequences are cut to this many tokens (the completion is cut; the prompt never is)."""
    num_buckets: int = 8
    p_context: float = 0.05
    p_future: float = 0.95
    trajectory_ratio: float = 0.1
    """Share of samples that get trajectory masking; 0 gives standard MDLM SFT."""
    trajectory_selection: Literal["per_draw", "fixed_subset"] = "per_draw"
    """per_draw: each sample independently at every draw; fixed_subset: a fixed set of examples (needs example_id)."""
    trajectory_loss_weight: TrajectoryLossWeight = "elbo"
    noise_schedule: str = "linear"
    min_t: float = 1e-3
    train_on_padding: bool = True
    """LLaDA convention: EOS padding is attended, maskable and in the loss (the model learns to stop)."""
    pad_to_multiple_of: int | None = None
    bucket_ordering: Ordering = "hard_to_easy"
    """Ordering the bucket ids were made with; only used to put padding/end tokens in the easiest bucket."""
    student_format: StudentFormat = field(default_factory=StudentFormat)
    seed: int = 0
    epoch: int = 0
    """Set by MDLMTrainer at every epoch. Masks are a function of (seed, epoch, batch content), so a run
    resumed from a checkpoint, or using several DataLoader workers, draws exactly the same masks."""

    def __post_init__(self) -> None:
        if self.mask_token_id is None:
            self.mask_token_id = getattr(self.tokenizer, "mask_token_id", None)
        if self.mask_token_id is None:
            raise ValueError("The tokenizer has no mask token: pass mask_token_id=trims_hf.mask_token_id(model).")
        if self.tokenizer.eos_token_id is None:
            raise ValueError("The student tokenizer needs an EOS token (used for end of response and padding).")
        if not 0.0 <= self.trajectory_ratio <= 1.0:
            raise ValueError(f"trajectory_ratio must be in [0, 1], got {self.trajectory_ratio}.")
        for name in ("p_context", "p_future"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}.")
        if not 1 <= self.num_buckets <= MAX_BUCKETS:
            raise ValueError(f"num_buckets must be in [1, {MAX_BUCKETS}], got {self.num_buckets}.")
        self._schedule = get_schedule(self.noise_schedule)

    @property
    def needs_buckets(self) -> bool:
        return self.trajectory_ratio > 0

    def _generator(self, input_ids: np.ndarray) -> torch.Generator:
        digest = hashlib.blake2b(input_ids.tobytes(), digest_size=8, key=str(input_ids.shape).encode()).digest()
        entropy = [self.seed, self.epoch, int.from_bytes(digest, "little")]
        return torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 1))

    def _prepared(self, row: Mapping[str, Any], index: int) -> dict[str, Any]:
        where = row.get(schema.EXAMPLE_ID, index)
        if row.get(schema.INPUT_IDS) is not None:
            if self.needs_buckets and row.get(schema.BUCKET_IDS) is not None:
                row = {**row, schema.BUCKET_IDS: np.asarray(row[schema.BUCKET_IDS], dtype=np.int64)}
            schema.validate_prepared(row, where, self.num_buckets if self.needs_buckets else None)
            return row
        if self.needs_buckets:
            return tokenize_scored_row(row, self.tokenizer, self.num_buckets, self.bucket_ordering, self.student_format, where)
        prompt, completion = schema.split_prompt_completion(row, where)
        example = tokenize_example(self.tokenizer, prompt, completion, self.student_format)
        return {schema.INPUT_IDS: example.input_ids, schema.PROMPT_LENGTH: example.prompt_length}

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        rows = [self._prepared(row, index) for index, row in enumerate(features)]
        batch_size = len(rows)
        for index, row in enumerate(rows):
            where = features[index].get(schema.EXAMPLE_ID, index)
            if int(row[schema.PROMPT_LENGTH]) < 1:
                # Shifted students (Dream) predict token i from position i - 1: position 0 must stay visible.
                raise schema.SchemaError(f"row {where}: the prompt has no tokens; a row needs at least one (e.g. BOS).")
            if int(row[schema.PROMPT_LENGTH]) >= self.max_length:
                raise schema.SchemaError(
                    f"row {where}: the prompt has {row[schema.PROMPT_LENGTH]} tokens, leaving no room for the "
                    f"completion within max_length={self.max_length}."
                )
        lengths = np.array([min(len(row[schema.INPUT_IDS]), self.max_length) for row in rows])
        width = int(lengths.max())
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        eos = self.tokenizer.eos_token_id
        pad_bucket = easiest_bucket(self.num_buckets, self.bucket_ordering)

        input_ids = np.full((batch_size, width), eos, dtype=np.int64)
        bucket_ids = np.full((batch_size, width), pad_bucket, dtype=np.int64)
        prompt_lengths = np.array([int(row[schema.PROMPT_LENGTH]) for row in rows])
        for b, (row, length, prompt_length) in enumerate(zip(rows, lengths, prompt_lengths)):
            input_ids[b, :length] = row[schema.INPUT_IDS][:length]
            bucket_ids[b, :prompt_length] = -1
            if self.needs_buckets:
                bucket_ids[b, prompt_length:length] = row[schema.BUCKET_IDS][: length - prompt_length]

        positions = np.arange(width)[None, :]
        real = positions < lengths[:, None]
        maskable = positions >= prompt_lengths[:, None]
        if not self.train_on_padding:
            maskable &= real
        attention_mask = np.ones_like(input_ids) if self.train_on_padding else real.astype(np.int64)

        generator = self._generator(input_ids)
        clean = torch.from_numpy(input_ids)
        if self.trajectory_selection == "fixed_subset":
            if any(schema.EXAMPLE_ID not in row for row in features):
                raise schema.SchemaError(f"trajectory_selection='fixed_subset' needs an '{schema.EXAMPLE_ID}' column in every row.")
            ids = torch.tensor([int(row[schema.EXAMPLE_ID]) for row in features])
            is_trajectory = select_fixed_subset(ids, self.trajectory_ratio, self.seed)
            torch.rand(batch_size, generator=generator)  # keep the random stream aligned with per_draw
        elif self.trajectory_selection == "per_draw":
            is_trajectory = select_per_draw(batch_size, self.trajectory_ratio, generator)
        else:
            raise ValueError(f"Unknown trajectory_selection {self.trajectory_selection!r}.")
        noised = noise_batch(
            clean,
            torch.from_numpy(maskable),
            torch.from_numpy(bucket_ids),
            is_trajectory,
            mask_token_id=int(self.mask_token_id),
            num_buckets=self.num_buckets,
            p_context=self.p_context,
            p_future=self.p_future,
            schedule=self._schedule,
            min_t=self.min_t,
            trajectory_loss_weight=self.trajectory_loss_weight,
            generator=generator,
        )
        return {
            "input_ids": noised.input_ids,
            "attention_mask": torch.from_numpy(attention_mask),
            "labels": torch.where(noised.masked, clean, torch.full_like(clean, -100)),
            "response_mask": torch.from_numpy(maskable),
            "loss_weights": noised.loss_weights,
            "t": noised.t,
            "is_trajectory": noised.is_trajectory,
        }
