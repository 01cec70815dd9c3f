"""A text summary of a torch.profiler trace of training steps: where the step's time goes.

Every kernel (on a CPU: every aten operator's self time on the host) is charged to one category by the operator
that launched it and that operator's ancestors, read from the trace itself:

- ``optimizer``: under ``Optimizer.step`` or gradient clipping (``clip_grad_norm_``);
- ``attention``: scaled-dot-product attention and its backward;
- ``lm_head``: a matmul with the vocabulary as one of its dimensions (the output head, forward and backward);
- ``loss``: the cross-entropy of the masked tokens (log-softmax, NLL and their backward);
- ``lora``: a matmul with the LoRA rank as one of its dimensions (the adapters' extra matmuls);
- ``frozen_matmul``: every other matmul (the base model's projections, an MoE's grouped expert GEMMs);
- ``other``: the rest (norms, rotary, activations, dropout, casts, copies).

Host time against device time and kernel launches per step come from the same trace. Nothing here is timed by the
caller: the profiler's own overhead inflates host times, so the summary says where time goes, not how fast a step is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

CATEGORIES = ("frozen_matmul", "lora", "attention", "lm_head", "loss", "optimizer", "other")
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::_scaled_mm",
           "aten::_grouped_mm", "aten::_scaled_grouped_mm")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def _dims(event: Any) -> set[int]:
    return {size for shape in (getattr(event, "input_shapes", None) or []) if isinstance(shape, list)
            for size in shape if isinstance(size, int)}


def category(event: Any, vocab: int, rank: int) -> str:
    """The category of an operator event, from its own name and shapes and those of its ancestors."""
    chain = []
    while event is not None:
        chain.append(event)
        event = event.cpu_parent
    names = [e.name for e in chain]
    if any("Optimizer.step" in n or "clip_grad" in n for n in names):
        return "optimizer"
    if any("scaled_dot_product" in n or "flash_attention" in n or "efficient_attention" in n
           or "cudnn_attention" in n or "ScaledDotProduct" in n for n in names):
        return "attention"
    if any(n in ("aten::log_softmax", "aten::_log_softmax", "aten::nll_loss", "aten::cross_entropy_loss",
                 "aten::_log_softmax_backward_data", "aten::nll_loss_backward") or "LogSoftmaxBackward" in n
           or "NllLossBackward" in n for n in names):
        return "loss"
    for e in chain:
        if e.name in MATMULS:
            dims = _dims(e)
            if vocab in dims:
                return "lm_head"
            if rank in dims:
                return "lora"
            return "frozen_matmul"
    return "other"


def summarise(events: Iterable[Any], steps: int, vocab: int, rank: int, wall_s: float, title: str) -> str:
    """The summary of a trace of ``steps`` training steps (``profiler.events()``) that took ``wall_s`` seconds."""
    events = list(events)
    kernels = [e for e in events if getattr(e.device_type, "name", "") == "CUDA"]
    per_category: Counter[str] = Counter()
    per_kernel: Counter[str] = Counter()
    if kernels:  # each kernel's time, charged through the operator that launched it
        for operator in events:
            for kernel in getattr(operator, "kernels", []) or []:
                per_category[category(operator, vocab, rank)] += kernel.duration
                per_kernel[kernel.name] += kernel.duration
        timing = "device time of the kernels each operator launched"
    else:  # a CPU: each operator's own (self) time on the host
        for operator in events:
            if operator.name.startswith("aten::"):
                per_category[category(operator, vocab, rank)] += operator.self_cpu_time_total
                per_kernel[operator.name] += operator.self_cpu_time_total
        timing = "self host time of the aten operators"
    device_us = sum(per_category.values())
    host_us = sum(e.self_cpu_time_total for e in events)
    launches = sum(1 for e in events if e.name in LAUNCHES)
    lines = [f"== {title} ==", f"steps profiled: {steps}; wall {wall_s * 1e3 / steps:.1f} ms per step",
             f"timed by: {timing}",
             f"device (or aten self) time per step: {device_us / 1e3 / steps:.1f} ms "
             f"({device_us / 1e4 / wall_s:.1f}% of the wall clock)",
             f"host time (all operators' self time) per step: {host_us / 1e3 / steps:.1f} ms",
             f"kernel launches per step: {launches / steps:.0f}", "", "time per category (per step, share):"]
    for name in CATEGORIES:
        share = per_category[name] / device_us * 100 if device_us else 0.0
        lines.append(f"  {name:<14} {per_category[name] / 1e3 / steps:9.2f} ms  {share:5.1f}%")
    lines += ["", "top kernels by time (per step, share):"]
    for name, us in per_kernel.most_common(15):
        lines.append(f"  {us / 1e3 / steps:9.2f} ms  {us / device_us * 100 if device_us else 0:5.1f}%  {name[:110]}")
    return "\n".join(lines) + "\n"
