"""The curve: the MDLM base alone over a grid of knobs (student size, batch, base steps), probed cheapest first, and
the pre-registered rule that picks the cheapest point whose base reaches the target with long, mixed answers."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .copies import RECALL_VIEWS
from .protocol import RegimeProtocol
from .records import unit_record


@dataclass(frozen=True)
class CurveGrid:
    """The knobs the curve crosses (every combination is a point), each point a base trained from its size's
    pretrained model and probed on every level."""

    sizes: tuple[tuple[int, int, int], ...] = ((64, 4, 4), (128, 4, 4))
    """(hidden, layers, heads) of the tiny Llama."""
    batch_sizes: tuple[int, ...] = (16, 32)
    base_steps: tuple[int, ...] = (500, 1000, 2000)
    pretrain_steps: tuple[int, ...] = ()
    """Autoregressive steps of the pretrained model (the student's start and the teacher); none: the protocol's."""
    base_lrs: tuple[float, ...] = ()
    """The base's learning rates; none: the protocol's."""
    anneal_fractions: tuple[float, ...] = ()
    """Shares of the base's steps over which its attention anneals from causal to bidirectional; none: the
    protocol's ``anneal_steps``."""

    def points(self, protocol: RegimeProtocol) -> list[RegimeProtocol]:
        """Every point as a protocol, cheapest first (:meth:`RegimeProtocol.cost`; ties: smaller model, fewer steps,
        then the grid's order of learning rates and annealing)."""
        points = [dataclasses.replace(protocol, hidden_size=h, num_layers=layers, num_heads=heads, batch_size=batch,
                                      base_steps=steps, pretrain_steps=pretrain, base_lr=lr,
                                      anneal_steps=protocol.anneal_steps if share is None else round(share * steps))
                  for h, layers, heads in self.sizes for pretrain in self.pretrain_steps or (protocol.pretrain_steps,)
                  for batch in self.batch_sizes for steps in self.base_steps
                  for lr in self.base_lrs or (protocol.base_lr,) for share in self.anneal_fractions or (None,)]
        return sorted(points, key=lambda p: (p.cost(), p.parameters(), p.pretrain_steps, p.base_steps))


def pretrained_tag(p: RegimeProtocol) -> str:
    """The pretrained model's part of a point's name: its size, and its steps when not the default."""
    steps = "" if p.pretrain_steps == RegimeProtocol.pretrain_steps else f"-p{p.pretrain_steps}"
    return f"h{p.hidden_size}-L{p.num_layers}{steps}"


def point_name(p: RegimeProtocol) -> str:
    """A point's name: the pretrained model, batch and steps, and the base's learning rate and annealing where not the
    defaults."""
    lr = "" if p.base_lr == RegimeProtocol.base_lr else f"-lr{p.base_lr:g}"
    anneal = f"-a{p.anneal_steps}" if p.anneal_steps else ""
    return f"{pretrained_tag(p)}-b{p.batch_size}-s{p.base_steps}{lr}{anneal}"


def size_folder(output: Path, p: RegimeProtocol) -> Path:
    """One study folder per pretrained model (size and steps): its points share the data, the pretrained model and
    the scores, and each rebuilds only the base and the probe."""
    return output / pretrained_tag(p)


def point_row(p: RegimeProtocol, study_folder: Path) -> dict[str, Any]:
    """What the curve keeps of a probed point: its knobs, cost, the probe per level, the hard tokens' share of the
    teacher's NLL, the wall times of its base and probe, and every setting it ran with that is not the protocol's
    default (``FIELD=VALUE``, as ``--set`` takes them), which the seed study takes up."""
    from ..protocol import changed_settings

    base, probe = unit_record(study_folder, "base"), unit_record(study_folder, "probe")
    hardest = base["buckets"]["per_bucket"][0]
    return {"point": point_name(p), "hidden_size": p.hidden_size, "num_layers": p.num_layers, "num_heads": p.num_heads,
            "batch_size": p.batch_size,
            "base_steps": p.base_steps, "pretrain_steps": p.pretrain_steps, "base_lr": p.base_lr,
            "anneal_steps": p.anneal_steps, "parameters": p.parameters(), "cost": p.cost(),
            "hard_share": hardest["nll_share"], "levels": {int(k): v for k, v in probe["levels"].items()},
            "base_wall_s": base["wall_s"], "probe_wall_s": probe["wall_s"],
            "settings": changed_settings(p, RegimeProtocol())}


def meets(row: Mapping[str, Any], level: int, p: RegimeProtocol) -> dict[str, bool]:
    """The rule's three conditions for a point at a level."""
    probe = row["levels"][level]
    return {"accuracy": probe["accuracy"] >= p.target_accuracy, "long": probe["answer_tokens"] >= p.min_answer_tokens,
            "mixed": row["hard_share"] >= p.min_hard_share}


def choose(rows: Sequence[Mapping[str, Any]], p: RegimeProtocol) -> dict[str, Any] | None:
    """The pre-registered rule (docs/regime.md): among the probed (point, level) pairs meeting all three conditions,
    the point of least cost; on a tie, the harder level, then the more accurate. If none meets them, the most accurate
    pair among those with long and mixed answers, flagged ``meets_target: False``. None when nothing was probed."""
    pairs = [(row, level) for row in rows for level in row["levels"]]
    meeting = [(row, level) for row, level in pairs if all(meets(row, level, p).values())]
    if meeting:
        row, level = min(meeting, key=lambda pair: (pair[0]["cost"], -pair[1], -pair[0]["levels"][pair[1]]["accuracy"]))
        return {"point": row["point"], "level": level, "meets_target": True}
    shaped = [(row, level) for row, level in pairs if meets(row, level, p)["long"] and meets(row, level, p)["mixed"]]
    if not shaped:
        return None
    row, level = max(shaped, key=lambda pair: (pair[0]["levels"][pair[1]]["accuracy"], -pair[0]["cost"]))
    return {"point": row["point"], "level": level, "meets_target": False}


def read_curve(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``curve.jsonl`` (the levels keyed by number again)."""
    from ...evaluation.tasks.base import read_json_rows

    rows = read_json_rows(path)
    for row in rows:
        row["levels"] = {int(k): v for k, v in row["levels"].items()}
    return rows


VARIANT_SHARE = 4
"""The study's variants train a quarter of their base's steps (the demo: 150 after 500)."""


def chosen_protocol(protocol: RegimeProtocol, rows: Sequence[Mapping[str, Any]]) -> RegimeProtocol:
    """The seed study's protocol from a curve: the settings the curve ran with (its rows record them; a curve from
    before they did ran with ``protocol``'s), then the chosen point's size, pretrained model, batch and steps, the
    variants at a quarter of the base's steps, the chosen level as the test level. ValueError when the curve chose
    nothing or its choice missed the target (a study at the floor cannot judge "at equal accuracy")."""
    from ..protocol import with_overrides

    chosen = choose(rows, protocol)
    if chosen is None or not chosen["meets_target"]:
        raise ValueError("the curve chose no point that meets the rule (see its curve.md): no study is run there.")
    row = next(r for r in rows if r["point"] == chosen["point"])
    protocol = with_overrides(protocol, row.get("settings", []))
    return dataclasses.replace(protocol, hidden_size=row["hidden_size"], num_layers=row["num_layers"],
                               num_heads=row.get("num_heads", protocol.num_heads),
                               pretrain_steps=row.get("pretrain_steps", RegimeProtocol.pretrain_steps),
                               batch_size=row["batch_size"], base_steps=row["base_steps"],
                               base_lr=row.get("base_lr", RegimeProtocol.base_lr),
                               anneal_steps=row.get("anneal_steps", 0),
                               variant_steps=max(1, row["base_steps"] // VARIANT_SHARE), test_level=chosen["level"])


def run_curve(output: Path, protocol: RegimeProtocol, grid: CurveGrid, budget_s: float = math.inf) -> list[dict]:
    """Probe the grid's points cheapest first into ``output`` (``curve.jsonl``, one row per finished point; a rerun
    skips them). It stops once a point meets the rule and every point of the same cost has run (a dearer point can no
    longer be chosen), or before a point would start after ``budget_s``; returns the rows."""
    from ...evaluation.tasks.base import write_json_rows
    from .study import RegimeStudy

    start, path = time.monotonic(), output / "curve.jsonl"
    rows = read_curve(path) if path.is_file() else []
    done = {row["point"] for row in rows}
    for p in grid.points(protocol):
        chosen = choose(rows, protocol)
        if chosen and chosen["meets_target"] and p.cost() > next(r["cost"] for r in rows if r["point"] == chosen["point"]):
            print(f"stopped: {chosen['point']} meets the rule; every later point costs more.", flush=True)
            break
        if point_name(p) in done:
            continue
        if time.monotonic() - start > budget_s:
            print(f"stopped for time before {point_name(p)} (budget {budget_s / 60:.0f} min).", flush=True)
            break
        folder = size_folder(output, p)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"\n=== point {point_name(p)} (cost {p.cost():.3g}) ===", flush=True)
        RegimeStudy(folder, p).run(until="probe")
        rows.append(point_row(p, folder))
        write_json_rows(path, rows)
    return rows


def format_curve(rows: Sequence[Mapping[str, Any]], p: RegimeProtocol) -> str:
    """The curve as a Markdown table, one line per point and level, with the rule's conditions and its choice."""
    chosen = choose(rows, p)
    lines = ["| point | level | cost (1e9) | base accuracy % | tokens / answer | tokens / step | hard share | results "
             "computed % | meets | base wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: r["cost"]):
        for level, probe in sorted(row["levels"].items()):
            ok = meets(row, level, p)
            mark = " **(chosen)**" if chosen and (chosen["point"], chosen["level"]) == (row["point"], level) else ""
            lines.append(f"| {row['point']}{mark} | {level} | {row['cost'] / 1e9:.2f} | {100 * probe['accuracy']:.1f} | "
                         f"{probe['answer_tokens']:.1f} | {probe['tokens_per_step']:.2f} | {row['hard_share']:.2f} | "
                         f"{computed(probe)} | "
                         f"{'yes' if all(ok.values()) else 'no (' + ', '.join(k for k, v in ok.items() if not v) + ')'} | "
                         f"{row['base_wall_s']:.0f} |")
    verdict = ("no probed point has long and mixed answers" if chosen is None else
               f"chosen: {chosen['point']} at level {chosen['level']}"
               + ("" if chosen["meets_target"] else " (NO point met the rule: the most accurate long and mixed one)"))
    return "\n".join(lines) + f"\n\n{verdict}.\n"


def computed(probe: Mapping[str, Any]) -> str:
    """The share of results the base gets right with every later number masked (:func:`result_recall`), as a table
    cell; probes from before the probe read it have none."""
    copies = probe.get("copies")
    return "-" if copies is None else f"{100 * copies[RECALL_VIEWS[1]]:.1f}"


def plot_curve(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Base accuracy against training cost, one line per (size, batch, level)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4))
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        for level, probe in row["levels"].items():
            key = (f"h{row['hidden_size']} p{row.get('pretrain_steps', 400)} b{row['batch_size']} "
                   f"lr{row.get('base_lr', 1e-3):g} a{row.get('anneal_steps', 0)} level {level}")
            series.setdefault(key, []).append((row["base_steps"], 100 * probe["accuracy"]))
    for key, points in sorted(series.items()):
        xs, ys = zip(*sorted(points), strict=True)
        axis.plot(xs, ys, marker="o", label=key)
    axis.axhline(60, color="grey", linestyle="--", linewidth=1)
    axis.set_xlabel("base MDLM steps")
    axis.set_ylabel("base accuracy at tau 0.9 (%)")
    axis.set_title("MDLM base alone: held-out accuracy")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
