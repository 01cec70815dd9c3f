"""What a regime study's records say, read back: a finished unit's record and a result's mean answer length. Shared by
the study, the curve and the reading, and importing nothing of theirs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def unit_record(folder: Path, unit: str) -> dict[str, Any]:
    """What a finished unit recorded (``unit.json``)."""
    return json.loads((folder / unit / "unit.json").read_text())


def answer_tokens(result: Any) -> float:
    """Mean generated tokens per answer (no EOS, nothing after a stop string) of an evaluation."""
    return statistics.fmean(sample.non_eos_tokens for sample in result.samples) if result.samples else 0.0
