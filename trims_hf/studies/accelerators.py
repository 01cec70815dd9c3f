"""Accelerators' data-sheet peaks, and the one way a GPU run's time is budgeted from its FLOP and byte counts.

Both budgets a GPU window is planned with use it: the GPU benchmark's parts (``bench/gpu/budgets.py``) and a
study's stages (``recipes/smollm2``). Each names its own workload's achieved fractions of the peaks (a LoRA step of
an 8B model keeps the tensor cores far busier than a 135M model's), with the measurement they come from; the
arithmetic that turns counts into seconds is :class:`TimeModel`, once. Torch-free, so a budget prints in a moment.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Accelerator:
    """Dense bf16 tensor-core peak (no sparsity) and HBM bandwidth, from the vendors' data sheets."""

    name: str
    bf16_tflops: float
    bandwidth_tb_s: float


ACCELERATORS = (
    ("GH200 144G", Accelerator("GH200 144GB HBM3e", 989.0, 4.9)),
    ("GH200", Accelerator("GH200 96GB HBM3", 989.0, 4.0)),
    ("H200 NVL", Accelerator("H200 NVL", 835.0, 4.8)),
    ("H200", Accelerator("H200 SXM", 989.0, 4.8)),
    ("H100 NVL", Accelerator("H100 NVL", 835.0, 3.9)),
    ("H100 PCIe", Accelerator("H100 PCIe", 756.0, 2.0)),
    ("H100", Accelerator("H100 SXM", 989.0, 3.35)),
    ("A100-SXM4-80GB", Accelerator("A100 SXM 80GB", 312.0, 2.039)),
    ("A100 80GB PCIe", Accelerator("A100 PCIe 80GB", 312.0, 1.935)),
    ("A100", Accelerator("A100 40GB", 312.0, 1.555)),
    ("L40S", Accelerator("L40S", 362.0, 0.864)),
)
"""Matched in order against ``torch.cuda.get_device_name()``: the more specific names first."""


def accelerator(device_name: str) -> Accelerator | None:
    """The peaks of a CUDA device by its name; None for a CPU or a device missing from :data:`ACCELERATORS`."""
    return next((spec for key, spec in ACCELERATORS if key in device_name), None)


REFERENCE = "H100"
"""The accelerator every budget is planned for (an H100 SXM): an H200 has its arithmetic and more bandwidth, so a
budget that holds on it holds on an H200."""


def mfu(flops_per_token: float, tokens_per_s: float, peak: Accelerator | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the dense bf16 peak; None without a known peak."""
    return flops_per_token * tokens_per_s / (peak.bf16_tflops * 1e12) if peak else None


def weight_read_bound_ms(weight_bytes: int, peak: Accelerator | None) -> float | None:
    """Milliseconds to read every weight once at the peak bandwidth: no forward can be faster at small batch."""
    return weight_bytes / (peak.bandwidth_tb_s * 1e12) * 1e3 if peak else None


@dataclass(frozen=True)
class TimeModel:
    """Seconds of GPU work on :data:`REFERENCE` at achieved fractions of its peaks: matmul FLOPs at
    ``matmul_efficiency`` of the bf16 peak, weight reads at ``bandwidth_efficiency`` of the bandwidth; a budget is
    the work's seconds times ``slack`` (what the counts leave out: overlap lost, allocator, launches not counted)."""

    matmul_efficiency: float
    slack: float
    bandwidth_efficiency: float = 0.70

    @property
    def peak(self) -> Accelerator:
        return accelerator(REFERENCE)

    def matmul_s(self, flops: float) -> float:
        return flops / (self.peak.bf16_tflops * 1e12 * self.matmul_efficiency)

    def read_s(self, weight_bytes: float) -> float:
        return weight_bytes / (self.peak.bandwidth_tb_s * 1e12 * self.bandwidth_efficiency)

    def budget(self, seconds: float) -> float:
        return self.slack * seconds
