"""Figures of decoding trajectories: the decode-order heatmap and the per-step teacher NLL curve (Figure 7).

Figures are built with matplotlib's object-oriented API (no pyplot), so they render on headless machines
and never change the caller's backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch

NEVER_DECODED = "lightgrey"
"""Colour of response positions no decoding step chose (EOS fill after early stop, padding)."""


def plot_decode_order(
    decode_order: torch.Tensor, filled: torch.Tensor | None = None, path: str | Path | None = None, title: str = ""
) -> Figure:
    """Heatmap of the step at which each response position was decoded (rows: samples, columns: positions).

    Positions set to EOS by early stop (``filled``) and padding (-1) are never decoded: they are drawn grey and
    named in a legend, so the picture shows only what the model chose to commit.
    """
    steps = decode_order.double().numpy()
    hidden = steps < 0
    if filled is not None:
        hidden |= filled.numpy()
    figure = Figure(figsize=(max(6.0, steps.shape[1] / 24), max(2.4, steps.shape[0] / 4 + 1.0)), layout="constrained")
    axis = figure.subplots()
    colormap = matplotlib.colormaps["viridis"].with_extremes(bad=NEVER_DECODED)
    image = axis.imshow(np.ma.masked_array(steps, hidden), aspect="auto", interpolation="nearest", cmap=colormap)
    figure.colorbar(image, ax=axis, label="decoding step")
    axis.set(xlabel="response position", ylabel="sample", title=title or "Decode order")
    if hidden.any():
        never = Patch(facecolor=NEVER_DECODED, edgecolor="grey", label="never decoded (EOS fill after early stop, padding)")
        figure.legend(handles=[never], loc="outside lower center", fontsize=8, frameon=False)
    if path is not None:
        figure.savefig(path, bbox_inches="tight", dpi=120)
    return figure


def mean_curve(curves: Sequence[torch.Tensor]) -> np.ndarray:
    """Mean over samples at every step, ignoring NaN and samples that already finished."""
    width = max(curve.numel() for curve in curves)
    stacked = np.full((len(curves), width), np.nan)
    for row, curve in enumerate(curves):
        stacked[row, : curve.numel()] = curve.double().numpy()
    counts = (~np.isnan(stacked)).sum(axis=0)
    return np.where(counts > 0, np.nansum(stacked, axis=0) / np.maximum(counts, 1), np.nan)


def plot_teacher_nll(
    curves: Mapping[str, Sequence[torch.Tensor]], path: str | Path | None = None, title: str = ""
) -> Figure:
    """Per-step teacher NLL of partially decoded responses, one line per setting (mean over samples).

    ``curves[label]`` holds one :func:`~trims_hf.generation.hooks.teacher_nll_per_step` result per sample.
    """
    figure = Figure(figsize=(6.0, 4.0))
    axis = figure.subplots()
    for label, per_sample in curves.items():
        axis.plot(mean_curve(per_sample), label=label)
    axis.set(xlabel="decoding step", ylabel="teacher NLL per token", title=title or "Teacher NLL during decoding")
    axis.legend()
    if path is not None:
        figure.savefig(path, bbox_inches="tight", dpi=120)
    return figure
