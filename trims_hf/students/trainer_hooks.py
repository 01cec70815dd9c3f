"""What lets a plain ``transformers.Trainer`` train a student with the MDLM / TRIMS loss: forward hooks that take a
:class:`trims_hf.TrimsDataCollator` batch's loss-only keys out before the forward and set the one loss of
:mod:`trims_hf.students.loss` after it. :func:`~trims_hf.students.prepare_student` installs them on every student."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..data.schema import EPOCH_KEY, LOSS_KEYS, UNFOLLOWED_EPOCH
from .base import StudentSpec
from .block_diffusion import noised_half, training_inputs
from .loss import mdlm_loss
from .registry import check_batch_length, model_positions


class MDLMLossHooks:
    """Make ``model(**batch)`` on a :class:`trims_hf.TrimsDataCollator` batch return the MDLM loss.

    ``transformers.Trainer`` calls ``model(**batch, num_items_in_batch=N)``. Before the forward, the loss-only
    keys (``labels``, ``masked``, ``loss_weights``..., and ``epoch``) are taken out, so the model never computes its own
    (e.g. causal, shifted) loss and models without ``**kwargs`` still run (a block-diffusion student gets its training
    view, :mod:`trims_hf.students.block_diffusion`, instead of the noised ids); after it, the one MDLM loss of
    :mod:`trims_hf.students.loss` is computed from the logits and set as ``output.loss``. Calls without these keys
    (decoding, :class:`trims_hf.MDLMTrainer`) are untouched.
    """

    def __init__(self, spec: StudentSpec) -> None:
        self.spec = spec
        self._pending: dict[int, dict[str, Any]] = {}  # per thread: nn.DataParallel runs replicas in threads

    def before(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        if "masked" not in kwargs or "loss_weights" not in kwargs:
            return None
        if kwargs.get("labels") is None:  # before the forward (peft's causal-LM wrapper passes labels=None)
            raise ValueError("a TrimsDataCollator batch reached the model without its 'labels': a transformers.Trainer "
                             "takes them for a loss of its own when label_smoothing_factor > 0 or compute_loss_func is "
                             "given; the MDLM loss has no label smoothing, so leave label_smoothing_factor at 0 and "
                             "compute_loss_func unset.")
        epochs = kwargs.pop(EPOCH_KEY, None)
        training_step = module.training and torch.is_grad_enabled() and "num_items_in_batch" in kwargs
        if training_step and epochs is not None and bool((epochs == UNFOLLOWED_EPOCH).any()):
            # A Trainer moves to later epochs, and nothing tells the collator: each would repeat the first's masks.
            raise ValueError("nothing advances the TrimsDataCollator's epoch, so every epoch would train on the first "
                             "epoch's masks: pass callbacks=[trims_hf.CollatorEpochCallback(collator)] to the Trainer, "
                             "or train with trims_hf.MDLMTrainer.")
        check_batch_length(kwargs["input_ids"], model_positions(module))
        batch = {key: kwargs.pop(key) for key in (*LOSS_KEYS, "num_items_in_batch") if key in kwargs}
        self._pending[threading.get_ident()] = batch
        if self.spec.block_size is not None:
            kwargs.update(training_inputs(kwargs["input_ids"], kwargs.get("attention_mask"), batch["masked"],
                                          batch["labels"], self.spec.block_size))
        return args, kwargs

    def after(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> Any:
        batch = self._pending.pop(threading.get_ident(), None)
        if batch is None:
            return None
        logits = output.get("logits") if isinstance(output, Mapping) else None
        labels = batch["labels"]
        if self.spec.block_size is not None and isinstance(logits, torch.Tensor):
            logits = noised_half(logits, labels.shape[1])
        if not isinstance(logits, torch.Tensor) or logits.shape[:2] != labels.shape:
            raise ValueError(f"{type(module).__name__} does not return [batch, length, vocab] logits in a ModelOutput, "
                             "so a plain transformers.Trainer cannot train it with the MDLM loss: use trims_hf.MDLMTrainer.")
        output["loss"] = mdlm_loss(logits, labels, batch["masked"], batch["loss_weights"], self.spec,
                                   batch.get("num_items_in_batch"))
        return output


def use_mdlm_loss(model: nn.Module, spec: StudentSpec) -> None:
    """Let a plain ``transformers.Trainer`` train ``model`` with the MDLM loss (idempotent; the spec is updated).

    ``accepts_loss_kwargs`` makes the Trainer count the normaliser over all accumulated micro-batches (and
    devices) and pass it as ``num_items_in_batch``, whatever the forward's signature.
    """
    hooks = getattr(model, "_trims_loss_hooks", None)
    if hooks is not None:
        hooks.spec = spec
        return
    hooks = MDLMLossHooks(spec)
    model.register_forward_pre_hook(hooks.before, with_kwargs=True)
    model.register_forward_hook(hooks.after, with_kwargs=True)
    model._trims_loss_hooks = hooks
    model.accepts_loss_kwargs = True
