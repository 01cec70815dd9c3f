"""The MDLM / TRIMS training objective, written once for :class:`trims_hf.MDLMTrainer` and a plain ``Trainer``.

Pure tensor functions. For a batch of :class:`trims_hf.TrimsDataCollator` the loss is

    sum_b w_b * sum_{i masked in b} CE(logits_b[src(i)], x_b[i])  /  N

with ``w_b`` the sample's ELBO weight (1/t, or the trajectory option), ``src`` the student's logit alignment
(Dream reads position i - 1) and ``N`` the normaliser: the response tokens (``labels != -100``) of the whole
accumulated batch over all devices ("token"), or the number of sequences with each sequence's sum divided
by its own response length ("sequence"). ``labels`` hold the clean token at every response position, so
``transformers.Trainer`` counts exactly the "token" normaliser as its ``num_items_in_batch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F

from ..data.schema import IGNORE_INDEX

if TYPE_CHECKING:
    from .base import StudentSpec

Normalization = Literal["token", "sequence"]
NORMALIZATIONS = ("token", "sequence")


def check_normalization(value: str) -> None:
    """One line for a ``loss_normalization`` that is none of :data:`NORMALIZATIONS`."""
    if value not in NORMALIZATIONS:
        raise ValueError(f"loss_normalization={value!r}: choose {' or '.join(NORMALIZATIONS)}.")


def check_batch(labels: torch.Tensor, masked: torch.Tensor, loss_weights: torch.Tensor,
                logits: torch.Tensor | None = None) -> None:
    """The shapes the objective reads, checked without a device sync: labels and masked [B, L], loss_weights [B],
    logits [B, L, vocab]. Broadcasting would otherwise turn a [B, 1] weight or a logits tensor of another length into
    a plausible scalar."""
    if labels.dim() != 2 or masked.shape != labels.shape:
        raise ValueError(f"labels {tuple(labels.shape)} and masked {tuple(masked.shape)}: both [batch, length].")
    if not isinstance(loss_weights, torch.Tensor) or loss_weights.shape != labels.shape[:1]:
        raise ValueError(f"loss_weights: one per sample, shape ({labels.shape[0]},), got "
                         f"{tuple(loss_weights.shape) if isinstance(loss_weights, torch.Tensor) else loss_weights!r}.")
    if logits is not None and (logits.dim() != 3 or logits.shape[:2] != labels.shape):
        raise ValueError(f"logits {tuple(logits.shape)}: [batch, length, vocab] for labels {tuple(labels.shape)}.")


def per_sample_loss(logits: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor, loss_weights: torch.Tensor,
                    spec: StudentSpec) -> torch.Tensor:
    """``w_b`` times the cross-entropy summed over the masked tokens of each sample ([B]).

    Only the masked positions' logits are gathered and upcast, never the whole [B, L, vocab] tensor.
    """
    check_batch(labels, masked, loss_weights, logits)
    rows, cols = masked.nonzero(as_tuple=True)
    return masked_token_loss(logits[rows, spec.source_positions(cols)], labels, masked, loss_weights)


def masked_token_loss(token_logits: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor,
                      loss_weights: torch.Tensor) -> torch.Tensor:
    """:func:`per_sample_loss` from the masked tokens' logits alone ([M, vocab], in ``masked.nonzero()`` order, each
    read at the student's source position): what a model whose head ran on those positions only returns."""
    check_batch(labels, masked, loss_weights)
    rows, cols = masked.nonzero(as_tuple=True)
    if token_logits.dim() != 2 or token_logits.shape[0] != rows.numel():
        raise ValueError(f"token_logits {tuple(token_logits.shape)}: one row of logits per masked token ({rows.numel()}).")
    token_loss = F.cross_entropy(token_logits.float(), labels[rows, cols], reduction="none")
    summed = torch.zeros(labels.shape[0], device=token_logits.device, dtype=token_loss.dtype).index_add_(0, rows, token_loss)
    return summed * loss_weights.to(summed.dtype)


def normaliser(labels: torch.Tensor, normalization: Normalization) -> torch.Tensor:
    """This batch's share of ``N``: its response tokens ("token") or its number of sequences ("sequence")."""
    if normalization == "token":
        return (labels != IGNORE_INDEX).sum()
    return torch.tensor(labels.shape[0], device=labels.device)


def per_unit_loss(per_sample: torch.Tensor, labels: torch.Tensor, normalization: Normalization) -> torch.Tensor:
    """Per-sample losses as the normaliser counts them: as is ("token"), or over each response length ("sequence")."""
    if normalization == "token":
        return per_sample
    return per_sample / (labels != IGNORE_INDEX).sum(1).clamp(min=1)


def mdlm_loss(logits: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor, loss_weights: torch.Tensor,
              spec: StudentSpec, num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
    """The token-normalised objective of one micro-batch; ``num_items_in_batch`` is ``N`` over the accumulated batch
    (as transformers' Trainer counts it), else this batch's own response tokens."""
    if isinstance(num_items_in_batch, (int, float)) and not num_items_in_batch > 0:
        raise ValueError(f"num_items_in_batch={num_items_in_batch}: the response tokens the loss is averaged over, > 0.")
    total = per_sample_loss(logits, labels, masked, loss_weights, spec).sum()
    return total / (num_items_in_batch if num_items_in_batch is not None else normaliser(labels, "token"))
