"""The part whose goal was missed by the most, from a ``bench/real_size.py`` JSON-lines file: what a GPU window's
second call profiles (``run_all.sh --profile-worst FILE``). Prints the part and its shortfall (the measured value's
distance from its goal as a factor, :func:`real_size_parts.common.shortfall`), or nothing when every judged goal was met.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def worst_part(lines: list[dict]) -> tuple[str, float] | None:
    """(part, shortfall) of the line furthest from its goals, when it missed them (shortfall > 1)."""
    judged = [(line["goal_shortfall"], line["part"]) for line in lines if line.get("goal_shortfall") is not None]
    if not judged or max(judged)[0] <= 1:
        return None
    short, part = max(judged)
    return part, short


def main() -> None:
    path = Path(sys.argv[1])
    lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()] if path.is_file() else []
    found = worst_part(lines)
    if found:
        print(*found)


if __name__ == "__main__":
    main()
