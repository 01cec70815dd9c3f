"""The part whose goal was missed by the most, from a ``bench/real_size.py`` JSON-lines file: what a GPU window's
second call profiles (``run_all.sh --profile-worst FILE``). Prints the part and its shortfall (the measured value's
distance from its goal as a factor, :func:`real_size_parts.common.shortfall`; ``inf`` for a part that wrote an error
line, whose goal was not reached at all), or nothing when every judged goal was met. A file that cannot be read is
one ``error:`` line and exit 2.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def worst_part(lines: list[dict]) -> tuple[str, float] | None:
    """(part, shortfall) of the line furthest from its goals, when it missed them (shortfall > 1); an error line
    counts as missed without limit."""
    judged = [(math.inf if "error" in line else line["goal_shortfall"], line["part"]) for line in lines
              if "error" in line or line.get("goal_shortfall") is not None]
    if not judged or max(judged)[0] <= 1:
        return None
    short, part = max(judged)
    return part, short


def read_lines(path: Path) -> list[dict]:
    """The JSON lines of ``path``; ValueError naming the path and line when one is not a JSON object with a part."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    lines = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError as error:
            raise ValueError(f"{path} line {number}: not JSON ({error})") from None
        if not isinstance(line, dict) or "part" not in line:
            raise ValueError(f"{path} line {number}: not a real_size.py line (no \"part\")")
        lines.append(line)
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: worst_part.py REAL_SIZE_JSONL", file=sys.stderr)
        return 2
    try:
        found = worst_part(read_lines(Path(argv[0])))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if found:
        print(*found)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
