"""The largest per-device batch that fits, and the gradient accumulation that keeps the run's global batch.

transformers' ``auto_find_batch_size`` retries the whole training loop with a batch 0.9 times smaller after an
out-of-memory error and keeps ``gradient_accumulation_steps``, so the optimizer's batch shrinks with it and need not
divide the data; here the global batch is fixed and only its split changes, which (``padding: max_length``) leaves
the objective exact. The search runs before the Trainer is built, so the Trainer, its accelerator and DeepSpeed's
filled-in config see the chosen split from the start; accelerate's :func:`find_executable_batch_size` runs the tries.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from accelerate.utils import find_executable_batch_size
from accelerate.utils.memory import should_reduce_batch_size
from torch import nn
from transformers import Trainer, TrainingArguments

from ..errors import InputError
from ..students import StudentSpec, mask_token_id, student_spec
from ..students.loss import masked_token_loss
from .masked_forward import masked_logits

NOTHING_FITS = ("per-device batch 1 does not fit in memory at max_length: turn on activation_checkpointing, shorten "
                "max_length, or train on a device with more memory.")


def rows_per_process(global_batch: int, processes: int, devices_per_process: int = 1) -> int:
    """The rows each process contributes to one optimizer step (``global_batch`` >= 1, as MDLMConfig checks); a one-line
    error when the global batch cannot be split evenly over the processes, or when one process drives several GPUs
    (``torch.nn.DataParallel``: transformers multiplies the per-device batch by their number, and the probe would run
    on the first one only)."""
    if devices_per_process > 1:
        raise InputError(f"global_batch_size with {devices_per_process} GPUs in one process: launch one process per GPU "
                         "(accelerate launch or torchrun), or make one GPU visible (CUDA_VISIBLE_DEVICES).")
    if global_batch % processes:
        raise InputError(f"global_batch_size {global_batch} does not split evenly over {processes} processes: choose "
                         f"a multiple of {processes}, or launch a number of processes that divides {global_batch}.")
    return global_batch // processes


def largest_fitting_batch(fits: Callable[[int], object], rows: int) -> int:
    """The largest divisor of ``rows`` for which ``fits(batch)`` returns instead of running out of memory, tried
    from ``rows`` down: every divisor splits a process's rows into whole micro-batches of one size. Raises
    :class:`InputError` when even batch 1 runs out of memory."""
    candidates = [batch for batch in range(rows, 0, -1) if rows % batch == 0]

    def next_smaller() -> int:
        candidates.pop(0)
        return candidates[0] if candidates else 0

    @find_executable_batch_size(starting_batch_size=candidates[0], reduce_batch_size_fn=next_smaller)
    def tried(batch: int) -> int:
        fits(batch)
        return batch

    try:
        return tried()
    except RuntimeError:
        if candidates:
            raise
    raise InputError(NOTHING_FITS)


STAND_IN = (128, 128)  # elements enough for optimizers that keep small tensors' states apart (8-bit Adam: 4,096)
MODEL_BOUND_OPTIMIZERS = ("galore", "apollo", "lomo")
"""``optim`` names whose optimizer is built from the model itself (transformers: GaLore, APOLLO, LOMO), so a stand-in
cannot measure its states."""
OptimizerSpec = tuple[type, dict[str, Any]]
STATES_DO_NOT_FIT = -1
"""The batch a process reports when the optimizer's states alone do not fit (below 0, the "nothing fits" batch, so
the all-reduce's minimum carries it to every process)."""


def check_measurable(optim: str) -> None:
    """One-line :class:`InputError` for an ``optim`` built from the model, whose states a stand-in cannot measure."""
    optim = getattr(optim, "value", optim)  # TrainingArguments keeps an OptimizerNames member
    if any(name in optim for name in MODEL_BOUND_OPTIMIZERS):
        raise InputError(f"global_batch_size with optim {optim}: its optimizer is built from the model, so the batch "
                         "search cannot measure its states; set the split yourself (per_device_train_batch_size, "
                         "gradient_accumulation_steps).")


def optimizer_spec(args: TrainingArguments, given: OptimizerSpec | None = None,
                   optimizer: torch.optim.Optimizer | None = None) -> OptimizerSpec:
    """The class and settings of the optimizer the Trainer will build: its ``optimizers=`` instance, else its
    ``optimizer_cls_and_kwargs=``, else the one ``args.optim`` names. One-line :class:`InputError` for what a stand-in
    parameter cannot measure (an optimizer factory, or one built from the model)."""
    if optimizer is not None:
        return type(optimizer), dict(optimizer.defaults)
    if given is None:
        check_measurable(args.optim)
        given = Trainer.get_optimizer_cls_and_kwargs(args)
    optimizer_class, settings = given
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):  # a factory
        name = getattr(optimizer_class, "__name__", type(optimizer_class).__name__)
        raise InputError(f"global_batch_size with the optimizer factory {name}: the batch search "
                         "cannot measure its states; set the split yourself (per_device_train_batch_size, "
                         "gradient_accumulation_steps).")
    return optimizer_class, {key: value for key, value in settings.items()
                             if key not in ("params", "model", "optimizer_dict")}


def deepspeed_zero(args: TrainingArguments) -> tuple[int, bool] | None:
    """(ZeRO stage, optimizer offloaded to the host) of a DeepSpeed run (accelerate's plugin); None without DeepSpeed.
    A DeepSpeed config that builds its own optimizer is refused: its states are not the Trainer's optimizer's."""
    plugin = getattr(args, "deepspeed_plugin", None)
    if plugin is None:
        return None
    config = getattr(plugin, "deepspeed_config", None) or {}
    if "optimizer" in config:
        raise InputError("global_batch_size with a DeepSpeed config that builds its own optimizer (its \"optimizer\" "
                         "block): the batch search measures the Trainer's; drop the block (the recipe's zero2.json has "
                         "none) or set the split yourself.")
    zero = config.get("zero_optimization") or {}
    offload = (zero.get("offload_optimizer") or {}).get("device", "none") in ("cpu", "nvme")
    return int(zero.get("stage", 0)), offload


def optimizer_state_bytes(model: nn.Module, args: TrainingArguments, spec: OptimizerSpec) -> dict[torch.device, int]:
    """Per device, the bytes of optimizer state each process will hold there for ``model``'s trainable parameters
    once training steps. The run's optimizer (``spec``, :func:`optimizer_spec`) steps once on a stand-in of each
    trainable dtype, which gives its state per element: two moments in the parameter's dtype for AdamW, about a quarter
    of that for 8-bit Adam (embeddings at 32 bits, as the Trainer sets bitsandbytes for them), nothing for plain SGD.
    Under DeepSpeed the optimizer steps fp32 master copies (4 bytes more per element of a half-precision parameter),
    ZeRO stage 1 or 2 splits both over the processes, and an optimizer offloaded to the host holds nothing on the
    device."""
    zero = deepspeed_zero(args)
    if zero is not None and zero[1]:
        return {}
    optimizer_class, settings = spec
    eight_bit = "bitsandbytes" in str(optimizer_class) and settings.get("optim_bits") == 8
    embeddings = {id(p) for module in model.modules() if isinstance(module, nn.Embedding) for p in module.parameters()}
    counts: Counter = Counter()
    for parameter in model.parameters():
        if parameter.requires_grad:
            counts[parameter.device, parameter.dtype, eight_bit and id(parameter) in embeddings] += parameter.numel()
    split = args.world_size if zero is not None and zero[0] >= 1 else 1
    reserve: Counter = Counter()
    for (device, dtype, full_bits), count in counts.items():
        stand_in = nn.Parameter(torch.zeros(STAND_IN, dtype=torch.float32 if zero else dtype, device=device))
        stand_in.grad = torch.zeros_like(stand_in)
        optimizer = optimizer_class([stand_in], **(settings | ({"optim_bits": 32} if full_bits else {})))
        optimizer.step()
        state = sum(value.numel() * value.element_size() for values in optimizer.state.values()
                    for value in values.values() if torch.is_tensor(value))
        master = 4 if zero and dtype != torch.float32 else 0
        reserve[device] += (state / stand_in.numel() + master) * count / split
    return {device: int(nbytes) for device, nbytes in reserve.items()}


@contextmanager
def held(reserve: dict[torch.device, int]) -> Iterator[None]:
    """``reserve`` bytes of memory on each device kept allocated (not written) while the block runs."""
    tensors = [torch.empty(nbytes, dtype=torch.uint8, device=device) for device, nbytes in reserve.items()]
    try:
        yield
    finally:
        del tensors


def probe_step(model: nn.Module, student: StudentSpec, batch: int, length: int, args: TrainingArguments) -> None:
    """One forward and backward of ``batch`` rows of ``length`` tokens with every position masked, in the run's
    precision: the most memory a collated batch of that shape can take (the head and the fp32 logits run at the masked
    positions, whose number varies from draw to draw). The trainable parameters' gradients exist from the start, as
    they do from a step's second micro-batch on, and are dropped again at the end."""
    ids = torch.full((batch, length), mask_token_id(model), device=args.device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.zeros_like(ids),
              "masked": torch.ones_like(ids, dtype=torch.bool), "loss_weights": torch.ones(batch, device=args.device)}
    half = torch.bfloat16 if args.bf16 else torch.float16
    try:
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.grad = torch.zeros_like(parameter)
        with torch.autocast(args.device.type, dtype=half, enabled=args.bf16 or args.fp16):
            _, logits = masked_logits(model, student, inputs, model.get_output_embeddings())
            loss = masked_token_loss(logits, inputs["labels"], inputs["masked"], inputs["loss_weights"]).sum()
        loss.backward()
    finally:
        model.zero_grad(set_to_none=True)


def fit_global_batch(model: nn.Module, args: TrainingArguments, global_batch: int, length: int,
                     optimizer: OptimizerSpec | None = None) -> None:
    """Set ``args.per_device_train_batch_size`` to the largest batch whose training step at ``length`` tokens fits on
    every process (:func:`probe_step` on ``model``, moved to ``args.device``, in training mode and with the run's
    activation checkpointing, as ``Trainer.train`` will run it, beside the states of the run's optimizer, ``optimizer``
    or the one ``args`` names: :func:`optimizer_state_bytes`) and ``args.gradient_accumulation_steps`` so that batch x
    accumulation x processes == ``global_batch``. Every process ends the search with the same split, or with the same
    error (none is left waiting in a collective)."""
    rows = rows_per_process(global_batch, args.world_size, args.n_gpu)
    optimizer = optimizer_spec(args, optimizer)
    deepspeed_zero(args)  # refuses a DeepSpeed optimizer before the model moves
    if getattr(model, "hf_device_map", None) is None:  # a model placed by device_map stays where it is
        model.to(args.device)
    if args.activation_checkpointing:  # as Trainer.train enables it, which runs after the search
        settings = dict(args.activation_checkpointing_kwargs or {})
        model.activation_checkpointing_enable(every_n_layers=settings.pop("every_n_layers", 1),
                                              offload=settings.pop("offload", False),
                                              activation_checkpointing_kwargs=settings or None)
    student, training = student_spec(model), model.training
    reserve = optimizer_state_bytes(model, args, optimizer)
    model.train()  # checkpointing runs in training mode only; a loaded model is in eval mode
    try:
        with held(reserve):
            batch = largest_fitting_batch(lambda size: probe_step(model, student, size, length, args), rows)
    except InputError:
        batch = 0  # batch 1 does not fit here: every process learns it below
    except RuntimeError as error:  # the probes' out-of-memory errors end inside the search: this is the reserve's
        if not should_reduce_batch_size(error):
            raise
        batch = STATES_DO_NOT_FIT
    finally:
        model.train(training)
    if torch.distributed.is_available() and torch.distributed.is_initialized():  # every process trains the same split
        smallest = torch.tensor(batch, device=args.device)
        torch.distributed.all_reduce(smallest, op=torch.distributed.ReduceOp.MIN)
        batch = int(smallest.item())
    if batch == STATES_DO_NOT_FIT:
        states = ", ".join(f"{nbytes / 2**30:.2f} GiB on {device}" for device, nbytes in reserve.items())
        raise InputError(f"the optimizer's states ({states} per process) do not fit beside the model: train LoRA "
                         "adapters, shard them with ZeRO-2 over more processes (recipes/accelerate/zero2.yaml), use an "
                         "8-bit optimizer, or a device with more memory.")
    if batch == 0:
        raise InputError(NOTHING_FITS)
    args.per_device_train_batch_size, args.gradient_accumulation_steps = batch, rows // batch
    if args.process_index == 0:
        print(f"batch search: per-device batch {batch} x gradient accumulation {rows // batch} x {args.world_size} "
              f"process(es) = global batch {global_batch}", file=sys.stderr)
