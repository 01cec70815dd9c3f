"""The replication's windows read side by side: each window (one seed, its own base and selection) gets the seed
study's reading of its own records; across windows only seed-level summaries are given: counts of per-window verdicts
and the geometric mean of the per-window tokens per step ratios with its t-interval over the seeds (one value a
seed). The protocol reports each window beside the others and never pools them, so no number here mixes two windows'
problems.

Read from what a window's call wrote (``results.json`` and ``records.jsonl.gz``, as committed under
``docs/results/smollm2/``), so any reader can redo it without a GPU."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...evaluation.evaluate import EvalResult, SampleRecord
from ..regime.reading import claim_rows, frontier_rows, seed_interval

REPORT_FILES = ("results.json", "records.jsonl.gz")
"""What a window's folder must hold to be read."""


@dataclasses.dataclass
class Window:
    """One window's report read back: its folder, protocol (as recorded), selection and every evaluation with its
    graded problems, each tagged with the window's seed (the base included: it is this window's own)."""

    folder: Path
    protocol: dict[str, Any]
    selection: dict[str, Any]
    results: list[tuple[int, EvalResult]]
    decode_order: dict[str, float | None]

    @property
    def seed(self) -> int:
        return int(self.protocol["seed"])


def read_window(folder: Path) -> Window:
    """A window's ``results.json`` and ``records.jsonl.gz`` as :class:`Window`; ValueError naming the file when one
    is missing, unreadable, unfinished or its records do not match its results."""
    for name in REPORT_FILES:
        if not (folder / name).is_file():
            raise ValueError(f"{folder}: no {name} (a window's report folder holds {' and '.join(REPORT_FILES)})")
    try:
        return _read_window(folder)
    except (KeyError, TypeError) as error:
        raise ValueError(f"{folder}: not a window's report (no field {error} where the study writes one)") from None
    except (OSError, EOFError, json.JSONDecodeError) as error:
        raise ValueError(f"{folder}: a report file cannot be read ({error})") from None


def _read_window(folder: Path) -> Window:
    document = json.loads((folder / "results.json").read_text())
    if not document.get("main_comparison_complete"):
        raise ValueError(f"{folder / 'results.json'}: the main comparison is unfinished (missing: "
                         f"{', '.join(map(str, document.get('missing') or [])) or 'not recorded'})")
    samples: dict[tuple[str, float], list[SampleRecord]] = {}
    fields = {f.name for f in dataclasses.fields(SampleRecord)}
    with gzip.open(folder / "records.jsonl.gz", "rt") as handle:
        for line in handle:
            record = json.loads(line)
            samples.setdefault((record["model"], record["threshold"]), []).append(
                SampleRecord(**{k: v for k, v in record.items() if k in fields}))
    seed, results = int(document["protocol"]["seed"]), []
    for row in document["results"]:
        result = EvalResult(**{k: v for k, v in row.items() if k != "seed"})
        result.samples = samples.pop((result.model, result.decoding["threshold"]), [])
        if len(result.samples) != result.num_samples:
            raise ValueError(f"{folder / 'records.jsonl.gz'}: {len(result.samples)} records of {result.model} at "
                             f"threshold {result.decoding['threshold']}, {result.num_samples} in results.json")
        results.append((seed, result))
    if samples:
        raise ValueError(f"{folder / 'records.jsonl.gz'}: records of evaluations results.json lacks: "
                         f"{', '.join(f'{m} at {t}' for m, t in samples)}")
    return Window(folder, document["protocol"], document["selection"], results,
                  document.get("nll_vs_decode_step_spearman", {}))


def protocol_differences(windows: Sequence[Window]) -> tuple[list[str], dict[str, dict[int, Any]]]:
    """Fields whose values differ between windows (``seed`` aside), as dotted names, and fields some windows' records
    lack (a field the library added later), each with its value per window that recorded it."""
    def flat(value: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(value, dict):
            return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
        return {prefix[:-1]: value}

    flats = [flat({k: v for k, v in w.protocol.items() if k != "seed"}) for w in windows]
    names = sorted(set().union(*flats))
    differing = [n for n in names if all(n in f for f in flats) and len({json.dumps(f[n]) for f in flats}) > 1]
    absent = {n: {w.seed: f[n] for w, f in zip(windows, flats, strict=True) if n in f} for n in names
              if not all(n in f for f in flats)}
    return differing, absent


def geometric_mean_interval(ratios: Sequence[float]) -> str:
    """The geometric mean of per-seed ratios and its 95% t-interval over the seeds (taken on their logarithms, where a
    ratio's noise is symmetric), as ``1.009x (0.974x, 1.045x)``; ``-`` ends for one seed. A ratio that is not a
    positive number has no logarithm: ValueError."""
    if not ratios or not all(math.isfinite(ratio) and ratio > 0 for ratio in ratios):
        raise ValueError(f"geometric_mean_interval: the ratios must be positive, finite numbers, got {list(ratios)}.")
    mean, low, high = (math.exp(value) for value in seed_interval([math.log(ratio) for ratio in ratios]))
    return f"{mean:.3f}x (-, -)" if math.isnan(low) else f"{mean:.3f}x ({low:.3f}x, {high:.3f}x)"


def read_windows(folders: Sequence[Path]) -> str:
    """The reading of the windows in ``folders`` as Markdown; ValueError when a folder cannot be read, two windows
    share a seed, or their protocols differ in more than the seed."""
    windows = [read_window(Path(folder)) for folder in folders]
    differing, absent = protocol_differences(windows)
    if differing:
        raise ValueError(f"the windows ran different protocols ({', '.join(differing)}): read them apart")
    seeds = [w.seed for w in windows]
    if len(set(seeds)) < len(seeds):
        raise ValueError(f"two windows have the same seed ({seeds}): each window is one seed")
    claims = {w.seed: {(row["threshold"], row["model"]): row for row in claim_rows(w.results)} for w in windows}
    frontiers = {w.seed: {row["model"]: row for row in frontier_rows(w.results)} for w in windows}
    lines = [f"Windows: {', '.join(f'seed {w.seed} ({w.folder.name})' for w in windows)}; one seed each, each with "
             "its own base and selection, read apart (the protocol never pools them)."]
    if absent:
        lines.append("Fields some windows' records lack (the library added them later): " + "; ".join(
            f"{name} ({', '.join(f'seed {s} {v}' for s, v in values.items())})" for name, values in absent.items()) + ".")
    lines += ["", "| seed | selection accuracy per level (tau 0.9) | level evaluated | meets target |", "|---|---|---|---|"]
    for w in windows:
        accuracies = ", ".join(f"L{lv} {100 * a:.1f}%" for lv, a in w.selection["accuracies"].items())
        lines.append(f"| {w.seed} | {accuracies} | {w.selection['level']} | {w.selection['meets_target']} |")
    lines += ["", "Per window, each TRIMS variant against that window's MDLM: tokens per step ratio; accuracy "
              "difference in points over the paired problems (95% interval).", "",
              "| threshold | model | " + " | ".join(f"seed {s}" for s in seeds) + " | ratio above 1 | interval "
              "includes 0 or favours TRIMS | geometric mean ratio (95% interval over the seeds) |",
              "|---|---|" + "---|" * len(seeds) + "---|---|---|"]
    keys = list(dict.fromkeys(key for seed in seeds for key in claims[seed]))
    for tau, model in sorted(keys, key=lambda key: key[0]):
        cells, ratios, not_worse = [], [], 0
        for seed in seeds:
            row = claims[seed].get((tau, model))
            if row is None:
                cells.append("-")
                continue
            ratio, (low, high) = row["ratio_per_seed"][seed], row["difference_interval"]
            ratios.append(ratio)
            not_worse += high >= 0
            cells.append(f"{ratio:.3f}x, {100 * row['accuracy_difference']:+.1f} ({100 * low:+.1f}, {100 * high:+.1f})")
        above = sum(ratio > 1 for ratio in ratios)
        lines.append(f"| {tau} | {model} | {' | '.join(cells)} | {above} of {len(seeds)} | {not_worse} of {len(seeds)} "
                     f"| {geometric_mean_interval(ratios) if len(ratios) == len(seeds) else '-'} |")
    lines += ["", "AUP minus MDLM's per window (both against the pair's best accuracy in that window; a point more than "
              "5 accuracy points below a curve's lowest-parallelism point is left out of its AUP, so one point "
              "crossing that cut moves a difference by hundreds):", "",
              "| model | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for model in dict.fromkeys(m for s in seeds for m in frontiers[s]):
        cells = [f"{frontiers[s][model]['aup_difference']:+.1f}" if model in frontiers[s] else "-" for s in seeds]
        lines.append(f"| {model} | {' | '.join(cells)} |")
    lines += ["", "Decode order at the traced threshold (Spearman of teacher NLL and commit lateness; negative: hard "
              "tokens first):", ""]
    for w in windows:
        order = ", ".join(f"{m} {'-' if v is None else f'{v:+.2f}'}" for m, v in w.decode_order.items())
        lines.append(f"- seed {w.seed}: {order}")
    return "\n".join(lines) + "\n"
