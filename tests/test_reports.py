"""The one markdown table writer."""

from __future__ import annotations

from trims_hf.reports import markdown_table


def test_markdown_table():
    assert markdown_table(["a", "b"], [["1", "2"], ["3", "4"]]) == "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |"
    assert markdown_table(["only"], []) == "| only |\n|---|"
