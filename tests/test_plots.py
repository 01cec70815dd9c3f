"""The decode-order heatmap names its never-decoded (grey) area in a legend."""

from __future__ import annotations

import torch
from matplotlib.colors import to_rgba

from trims_hf.generation.plots import NEVER_DECODED, plot_decode_order


def test_decode_order_legend_names_the_never_decoded_area(tmp_path):
    order = torch.tensor([[0, 1, 2, 3], [1, 0, -1, -1]])  # second sample: two padding positions
    filled = torch.tensor([[False, False, True, True], [False] * 4])  # first sample: EOS fill after early stop
    figure = plot_decode_order(order, filled, tmp_path / "order.png")
    (legend,) = figure.legends
    (patch,) = legend.get_patches()
    assert [t.get_text() for t in legend.get_texts()] == ["never decoded (EOS fill after early stop, padding)"]
    bad = tuple(figure.axes[0].images[0].get_cmap().get_bad())
    assert patch.get_facecolor() == bad == to_rgba(NEVER_DECODED)  # the legend's grey is the heatmap's
    image = figure.axes[0].images[0].get_array()
    assert image.mask.tolist() == [[False, False, True, True], [False, False, True, True]]  # fill and padding hidden
    assert (tmp_path / "order.png").read_bytes()[:4] == b"\x89PNG"


def test_no_legend_when_every_position_was_decoded():
    assert plot_decode_order(torch.tensor([[0, 1], [1, 0]])).legends == []
