"""TrimsDataCollator: prepared student rows -> a noised MDLM training batch.

It only pads, selects the trajectory samples and noises (the forward process of :mod:`trims_hf.training.masking`);
rows are prepared once beforehand by :func:`trims_hf.prepare_dataset` (``MDLMTrainer`` does it for you).
With ``trajectory_ratio = 0`` it is a plain MDLM SFT collator (the paper's "MDLM" baseline) and draws
exactly the same masks for the same seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

import numpy as np
import torch

from ..data import schema
from ..settings import MaskingConfig, check_field_types, check_seed
from .masking import noise_batch, select_fixed_subset, select_per_draw

# Columns the collator reads; the trainer keeps them when it drops unused dataset columns.
INPUT_COLUMNS = (schema.INPUT_IDS, schema.PROMPT_LENGTH, schema.BUCKET_IDS, schema.EXAMPLE_ID)
_KEY_BYTES = 64  # blake2b's longest key


@dataclass
class TrimsDataCollator:
    """Collate prepared rows into noised batches with TRIMS trajectory masking (paper Algorithm 1).

    Rows hold ``input_ids``, ``prompt_length`` and (for trajectory masking) ``bucket_ids``, as written by
    :func:`trims_hf.prepare_dataset`. Output keys: ``input_ids`` (noised) and ``attention_mask`` for the model;
    for the loss (:mod:`trims_hf.students.loss`) ``labels`` (the clean token at every response position the normaliser
    counts, EOS padding included when it is trained; -100 elsewhere), ``masked`` (the noised positions, where
    the loss is taken), ``loss_weights``, ``t`` and ``is_trajectory`` (per sample), and ``epoch`` (per sample: the
    epoch its masks were drawn for, -1 when no trainer callback advances it, which a plain ``Trainer`` refuses).

    A row's noise is drawn from its own seed (the collator's seed, the epoch, the row's tokens and example
    id), never from its batch-mates, so every split of a global batch over devices and accumulation steps
    draws the same masks.
    """

    tokenizer: Any
    mask_token_id: int | None = None
    """Student mask id; default ``tokenizer.mask_token_id`` (pass ``trims_hf.mask_token_id(model)`` otherwise)."""
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    max_length: int | None = None
    """The ``max_length`` the rows were prepared with; every batch is padded to it when ``masking.padding`` is
    ``"max_length"`` (MDLMTrainer passes its config's). Under either padding a longer row is an error naming it: it
    was prepared with another ``max_length``, and is never cut or passed on."""
    seed: int = 0
    epoch: int = 0
    """Advanced at every epoch by :class:`trims_hf.CollatorEpochCallback` (MDLMTrainer adds it; a plain ``Trainer``
    needs it in ``callbacks``). Masks are a function of (seed, epoch, row), so a run resumed from a checkpoint, or
    using several DataLoader workers, draws exactly the same masks. Kept in shared memory, so DataLoader workers
    (persistent ones too, which hold their own copy of the collator) read the epoch the trainer set."""

    def __post_init__(self) -> None:
        if self.mask_token_id is None:
            self.mask_token_id = getattr(self.tokenizer, "mask_token_id", None)
        if self.mask_token_id is None:
            raise ValueError("The tokenizer has no mask token: pass mask_token_id=trims_hf.mask_token_id(model).")
        if self.tokenizer.eos_token_id is None:
            raise ValueError("The student tokenizer needs an EOS token (used for end of response and padding).")
        if self.max_length is not None and (isinstance(self.max_length, bool) or not isinstance(self.max_length, Integral)
                                            or self.max_length < 2):
            raise ValueError(f"max_length={self.max_length!r}: must be a whole number of at least 2, the max_length the "
                             "rows were prepared with (StudentFormat.max_length).")
        check_field_types(self, TrimsDataCollator)
        if self.mask_token_id < 0:
            raise ValueError(f"mask_token_id={self.mask_token_id}: token ids are >= 0.")
        if self.mask_token_id == self.tokenizer.eos_token_id:
            raise ValueError(f"mask_token_id={self.mask_token_id} is the tokenizer's EOS id, which pads and ends every "
                             "response: a masked position would look like one; pass the student's mask id.")
        check_seed("seed", self.seed)
        if self.masking.padding == "max_length" and self.max_length is None:
            raise ValueError("padding='max_length' needs the collator's max_length (the one the rows were prepared with).")

    def _shared(self) -> torch.Tensor:
        """[epoch, followed] in shared memory: made before any worker starts, and seen by every copy of the collator."""
        state = self.__dict__.get("_epoch_state")
        if state is None:
            state = self.__dict__["_epoch_state"] = torch.zeros(2, dtype=torch.int64).share_memory_()
        return state

    def follow_epochs(self) -> None:
        """Record that a trainer callback advances the epoch (without one, every epoch would repeat the first's masks)."""
        self._shared()[1] = 1

    @property
    def epochs_followed(self) -> bool:
        return bool(self._shared()[1])

    @property
    def needs_buckets(self) -> bool:
        return self.masking.trajectory_ratio > 0

    def _generator(self, ids: np.ndarray, example_id: Any) -> torch.Generator:
        """A row's own generator: its masks do not depend on which rows share its batch."""
        key = f"{self.seed}/{self.epoch}/{example_id}".encode()
        if len(key) > _KEY_BYTES:  # a long id (a string hash) enters as its digest, after the seed and the epoch
            key = f"{self.seed}/{self.epoch}/#".encode() + hashlib.blake2b(str(example_id).encode(), digest_size=32).digest()
        digest = hashlib.blake2b(ids.tobytes(), digest_size=8, key=key).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)

    def _checked(self, row: Mapping[str, Any], index: int, vocab_size: int | None) -> Mapping[str, Any]:
        where = row.get(schema.EXAMPLE_ID, index)
        if row.get(schema.INPUT_IDS) is None and (schema.PROMPT in row or schema.MESSAGES in row):
            raise schema.SchemaError(
                f"row {where}: not prepared for the student (no '{schema.INPUT_IDS}'); prepare the data set once with "
                "trims_hf.prepare_dataset(dataset, tokenizer), or train with MDLMTrainer, which does it."
            )
        if row.get(schema.INPUT_IDS) is not None and schema.PROMPT_LENGTH not in row:
            raise schema.SchemaError(
                f"row {where}: no '{schema.PROMPT_LENGTH}' column; transformers.Trainer drops the columns its model's "
                "forward does not take: pass remove_unused_columns=False in the TrainingArguments (MDLMConfig does)."
            )
        schema.validate_prepared(row, where, self.masking.num_buckets if self.needs_buckets else None,
                                 self.mask_token_id, vocab_size)
        return row

    def _width(self, lengths: np.ndarray, rows: Sequence[Mapping[str, Any]]) -> int:
        masking = self.masking
        width = int(lengths.max())
        if self.max_length is not None and width > self.max_length:
            row = rows[int(lengths.argmax())]
            raise schema.SchemaError(f"row {row.get(schema.EXAMPLE_ID, int(lengths.argmax()))}: {width} tokens, more "
                                     f"than max_length={self.max_length}; prepare the rows with the same max_length.")
        if masking.padding == "max_length":
            width = self.max_length
        if masking.pad_to_multiple_of:
            width = -(-width // masking.pad_to_multiple_of) * masking.pad_to_multiple_of
        return width

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if len(features) == 0:
            raise ValueError("The collator got an empty batch; a batch holds at least one row.")
        vocab_size = len(self.tokenizer) if hasattr(self.tokenizer, "__len__") else None  # any tokenizer-like object
        rows = [self._checked(row, index, vocab_size) for index, row in enumerate(features)]
        masking = self.masking
        batch_size = len(rows)
        lengths = np.array([len(row[schema.INPUT_IDS]) for row in rows])
        width = self._width(lengths, rows)
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
        maskable = positions >= prompt_lengths[:, None]  # never position 0: a row has at least one prompt token
        if not masking.train_on_padding:
            maskable &= real
        attention_mask = np.ones_like(input_ids) if masking.train_on_padding else real.astype(np.int64)

        generators = [self._generator(input_ids[b, :length], row.get(schema.EXAMPLE_ID))
                      for b, (row, length) in enumerate(zip(rows, lengths))]
        clean = torch.from_numpy(input_ids)
        if masking.trajectory_selection == "fixed_subset":
            if any(schema.EXAMPLE_ID not in row for row in features):
                raise schema.SchemaError(
                    f"trajectory_selection='fixed_subset' needs an '{schema.EXAMPLE_ID}' column in every row.")
            if bad := [row[schema.EXAMPLE_ID] for row in features if isinstance(row[schema.EXAMPLE_ID], bool)
                       or not isinstance(row[schema.EXAMPLE_ID], Integral)]:
                raise schema.SchemaError(f"trajectory_selection='fixed_subset' selects rows by their integer "
                                         f"'{schema.EXAMPLE_ID}'; got {bad[0]!r}.")
            ids = torch.tensor([int(row[schema.EXAMPLE_ID]) for row in features])
            is_trajectory = select_fixed_subset(ids, masking.trajectory_ratio, self.seed)
            select_per_draw(batch_size, masking.trajectory_ratio, generators)  # keep the random streams aligned with per_draw
        else:
            is_trajectory = select_per_draw(batch_size, masking.trajectory_ratio, generators)
        noised = noise_batch(
            clean,
            torch.from_numpy(maskable),
            torch.from_numpy(bucket_ids),
            is_trajectory,
            mask_token_id=int(self.mask_token_id),
            config=masking,
            generator=generators,
        )
        return {
            "input_ids": noised.input_ids,
            "attention_mask": torch.from_numpy(attention_mask),
            "labels": torch.from_numpy(np.where(maskable, input_ids, schema.IGNORE_INDEX)),
            "masked": noised.masked,
            "loss_weights": noised.loss_weights,
            "t": noised.t,
            "is_trajectory": noised.is_trajectory,
            schema.EPOCH_KEY: torch.full((batch_size,), self.epoch if self.epochs_followed else schema.UNFOLLOWED_EPOCH),
        }


def _get_epoch(self: TrimsDataCollator) -> int:
    return int(self._shared()[0])


def _set_epoch(self: TrimsDataCollator, epoch: int) -> None:
    if isinstance(epoch, bool) or not isinstance(epoch, Integral) or epoch < 0:
        raise ValueError(f"epoch={epoch!r}: a whole number >= 0 (the epoch the masks are drawn for).")
    self._shared()[0] = int(epoch)


# ``epoch`` stays a dataclass field (an __init__ argument, kept by dataclasses.replace) read from shared memory.
TrimsDataCollator.epoch = property(_get_epoch, _set_epoch, doc="The epoch masks are drawn for (shared memory).")
