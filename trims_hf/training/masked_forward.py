"""The training forward at the masked positions: the logits of the masked tokens only, the LM head run on their hidden
states alone. :class:`~trims_hf.training.trainer.MDLMTrainer`'s loss and the batch search's memory probe share it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..students import StudentSpec
from ..students.block_diffusion import training_inputs


@contextmanager
def head_at(head: nn.Module | None, rows: torch.Tensor, positions: torch.Tensor) -> Iterator[list[bool]]:
    """Run the output head on the hidden states at (``rows``, ``positions``) only, so the forward returns [1, M, vocab]
    logits instead of [B, L, vocab]: mixed precision (accelerate's autocast wrapper upcasts every output to fp32)
    then copies M rows, not the whole tensor, and the head skips the unmasked positions. Yields ``[did it]``."""
    gathered = [False]

    def gather(module: nn.Module, args: tuple) -> tuple:
        hidden = args[0]
        if hidden.dim() != 3:  # a head called on anything but [B, L, hidden] keeps its input
            return None
        gathered[0] = True
        return (hidden[rows, positions][None], *args[1:])

    handle = head.register_forward_pre_hook(gather) if head is not None else None
    try:
        yield gathered
    finally:
        if handle is not None:
            handle.remove()


def masked_logits(model: nn.Module, student: StudentSpec, inputs: dict[str, torch.Tensor],
                  head: nn.Module | None) -> tuple[Any, torch.Tensor]:
    """The forward of a collated batch and the logits of its masked tokens ([M, vocab], ``masked.nonzero()`` order,
    read at the student's source positions); with ``head`` (the model's output embeddings) only those positions go
    through it (:func:`head_at`)."""
    rows, cols = inputs["masked"].nonzero(as_tuple=True)
    sources = student.source_positions(cols)
    with head_at(head, rows, sources) as gathered:
        outputs = model(**training_inputs(inputs["input_ids"], inputs.get("attention_mask"), inputs["masked"],
                                          inputs["labels"], student.block_size))
    return outputs, outputs.logits[0] if gathered[0] else outputs.logits[rows, sources]
