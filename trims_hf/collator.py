"""TrimsDataCollator: prepared student rows -> a noised MDLM training batch.

It only pads, selects the trajectory samples and noises (the forward process of :mod:`trims_hf.masking`);
rows are prepared once beforehand by :func:`trims_hf.prepare_dataset` (``MDLMTrainer`` does it for you).
With ``trajectory_ratio = 0`` it is a plain MDLM SFT collator (the paper's "MDLM" baseline) and draws
exactly the same masks for the same seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import schema
from .masking import noise_batch, select_fixed_subset, select_per_draw
from .settings import MaskingConfig

# Columns the collator reads; the trainer keeps them when it drops unused dataset columns.
INPUT_COLUMNS = (schema.INPUT_IDS, schema.PROMPT_LENGTH, schema.BUCKET_IDS, schema.EXAMPLE_ID)


@dataclass
class TrimsDataCollator:
    """Collate prepared rows into noised batches with TRIMS trajectory masking (paper Algorithm 1).

    Rows hold ``input_ids``, ``prompt_length`` and (for trajectory masking) ``bucket_ids``, as written by
    :func:`trims_hf.prepare_dataset`. Output keys: ``input_ids`` (noised), ``attention_mask``, ``labels``
    (clean ids at masked positions, -100 elsewhere), ``response_mask`` (positions counted by the loss
    normaliser), ``loss_weights``, ``t`` and ``is_trajectory`` (per sample).
    """

    tokenizer: Any
    mask_token_id: int | None = None
    """Student mask id; default ``tokenizer.mask_token_id`` (pass ``trims_hf.mask_token_id(model)`` otherwise)."""
    masking: MaskingConfig = field(default_factory=MaskingConfig)
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

    @property
    def needs_buckets(self) -> bool:
        return self.masking.trajectory_ratio > 0

    def _generator(self, input_ids: np.ndarray) -> torch.Generator:
        digest = hashlib.blake2b(input_ids.tobytes(), digest_size=8, key=str(input_ids.shape).encode()).digest()
        entropy = [self.seed, self.epoch, int.from_bytes(digest, "little")]
        return torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 1))

    def _checked(self, row: Mapping[str, Any], index: int) -> Mapping[str, Any]:
        where = row.get(schema.EXAMPLE_ID, index)
        if row.get(schema.INPUT_IDS) is None and (schema.PROMPT in row or schema.MESSAGES in row):
            raise schema.SchemaError(
                f"row {where}: not prepared for the student (no '{schema.INPUT_IDS}'); prepare the data set once with "
                "trims_hf.prepare_dataset(dataset, tokenizer), or train with MDLMTrainer, which does it."
            )
        schema.validate_prepared(row, where, self.masking.num_buckets if self.needs_buckets else None)
        return row

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        rows = [self._checked(row, index) for index, row in enumerate(features)]
        masking = self.masking
        batch_size = len(rows)
        lengths = np.array([len(row[schema.INPUT_IDS]) for row in rows])
        width = int(lengths.max())
        if masking.pad_to_multiple_of:
            width = -(-width // masking.pad_to_multiple_of) * masking.pad_to_multiple_of
        eos = self.tokenizer.eos_token_id

        input_ids = np.full((batch_size, width), eos, dtype=np.int64)
        bucket_ids = np.full((batch_size, width), masking.end_bucket, dtype=np.int64)
        prompt_lengths = np.array([int(row[schema.PROMPT_LENGTH]) for row in rows])
        for b, (row, length, prompt_length) in enumerate(zip(rows, lengths, prompt_lengths)):
            input_ids[b, :length] = row[schema.INPUT_IDS]
            bucket_ids[b, :prompt_length] = -1
            if self.needs_buckets:
                bucket_ids[b, prompt_length:length] = row[schema.BUCKET_IDS][: length - prompt_length]

        positions = np.arange(width)[None, :]
        real = positions < lengths[:, None]
        maskable = positions >= prompt_lengths[:, None]
        if not masking.train_on_padding:
            maskable &= real
        attention_mask = np.ones_like(input_ids) if masking.train_on_padding else real.astype(np.int64)

        generator = self._generator(input_ids)
        clean = torch.from_numpy(input_ids)
        if masking.trajectory_selection == "fixed_subset":
            if any(schema.EXAMPLE_ID not in row for row in features):
                raise schema.SchemaError(f"trajectory_selection='fixed_subset' needs an '{schema.EXAMPLE_ID}' column in every row.")
            ids = torch.tensor([int(row[schema.EXAMPLE_ID]) for row in features])
            is_trajectory = select_fixed_subset(ids, masking.trajectory_ratio, self.seed)
            torch.rand(batch_size, generator=generator)  # keep the random stream aligned with per_draw
        else:
            is_trajectory = select_per_draw(batch_size, masking.trajectory_ratio, generator)
        noised = noise_batch(
            clean,
            torch.from_numpy(maskable),
            torch.from_numpy(bucket_ids),
            is_trajectory,
            mask_token_id=int(self.mask_token_id),
            config=masking,
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
