"""An evaluation's results as a reader meets them: the results file (with AUP), the table like the paper's Tables
1-2 and the accuracy / tokens-per-step frontier (Figures 3-4), for ``trims eval``, a sweep and a study alike.

Every number comes from the :class:`~trims_hf.evaluation.evaluate.EvalResult` objects given; nothing is recomputed here but
AUP, which is a function of the (tokens per step, accuracy) points shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from ..reports import markdown_table, write_json
from .aup import ALPHA, Y_MIN_OFFSET, accuracy_under_parallelism
from .evaluate import SWEEP_PARAMETER
from .published import PublishedResult

if TYPE_CHECKING:
    from .evaluate import EvalResult

RESULT_UNITS = {
    "accuracy": "fraction of num_samples graded correct, 0-1 (tables, plots and model cards show percent)",
    "tokens_per_step": "counted tokens (before EOS and task stop strings) per forward pass, ratio of totals",
    "tokens_per_forward_non_eos": "non-EOS response tokens before a task stop string per forward pass, ratio of totals",
    "tokens_per_second": "counted tokens per second of decoding wall time (the slowest process's decoding)",
    "decode_time_s": "seconds of decoding (model calls), summed over batches and processes",
    "wall_time_s": "seconds of the evaluation run that finished the result (data, decoding and grading of every "
                   "setting evaluated together)",
}
"""What each number of a result file measures; written at the top of every file :func:`save_results` writes."""


AUP_DEFINITION = (f"d3LLM's accuracy under parallelism (trims_hf.evaluation.aup) over (tokens_per_step, accuracy in percent) of "
                  f"each model's settings on a task: alpha {ALPHA:g}, points more than {Y_MIN_OFFSET:g} accuracy points "
                  "below the lowest-parallelism one left out, y_max the best accuracy on the task among the rows shown")
"""What the ``aup`` rows of a results file and the AUP table measure."""


def aup_rows(results: Sequence[EvalResult], published: Sequence[PublishedResult] = ()) -> list[dict[str, Any]]:
    """AUP of each model's curve on each task (a sweep's settings; one result scores tokens/step x accuracy),
    published rows included, all of a task weighted by the same ``y_max`` as d3LLM's leaderboard weights them.
    ``aup`` is None for a curve AUP cannot score: a point at 0 tokens per step (AUP needs parallelism > 0), or a
    number that is not one (NaN, which the results file then refuses)."""
    shown = [*results, *published]
    rows = []
    for task in dict.fromkeys(r.task for r in results):
        in_task = [r for r in shown if r.task == task]
        y_max = max(100 * r.accuracy for r in in_task)
        for model in dict.fromkeys(r.model for r in in_task):
            points = [(r.tokens_per_step, 100 * r.accuracy) for r in in_task if r.model == model]
            scorable = all(0 < rho < math.inf and 0 <= y <= 100 for rho, y in points)
            value = accuracy_under_parallelism(points, y_max) if scorable else None
            rows.append({"model": model, "task": task, "aup": value, "y_max": y_max, "points": len(points)})
    return rows


def save_results(results: Sequence[EvalResult], path: str | Path,
                 published: Sequence[PublishedResult] = ()) -> Path:
    """Write ``{"units": ..., "results": [...], "aup": ...}`` (one schema for one result or a sweep) in one atomic
    step, so an interrupted write never leaves a half file, and as strict JSON (no NaN or Infinity). ``aup`` holds
    :func:`aup_rows` (with the ``published`` rows the table showed, so the file's numbers are the table's)."""
    aup = {"definition": AUP_DEFINITION, "rows": aup_rows(results, published)}
    return write_json(Path(path), {"units": RESULT_UNITS, "results": [r.to_dict() for r in results], "aup": aup})


def _sample_counts(results: Sequence[EvalResult]) -> str:
    """``n=100``, or ``n=50-100`` when the results were graded on different numbers of samples."""
    low, high = min(r.num_samples for r in results), max(r.num_samples for r in results)
    return f"n={low}" if low == high else f"n={low}-{high}"


def format_table(results: Sequence[EvalResult], published: Sequence[PublishedResult] = ()) -> str:
    """Markdown table like the paper's Tables 1-2: a row per model and setting, accuracy (%, with n) and
    tokens per step per task, then the ``published`` rows of those tasks (setting ``published``); below it the
    AUP of each model per task (:func:`aup_rows`)."""
    tasks = list(dict.fromkeys(r.task for r in results))
    rows: dict[tuple[str, str], dict[str, EvalResult]] = {}
    for result in results:
        rows.setdefault((result.model, result.setting), {})[result.task] = result
    uniform = {task: len({r.num_samples for r in results if r.task == task}) == 1 for task in tasks}
    header = ["Model", "Setting"]
    for task in tasks:
        n = f", {_sample_counts([r for r in results if r.task == task])}" if uniform[task] else ""
        header += [f"{task} Acc (%{n})", f"{task} Tokens/step"]
    body = []
    for (model, setting), by_task in rows.items():
        cells = [model, setting]
        for task in tasks:
            result = by_task.get(task)
            if result is None:
                cells += ["-", "-"]
                continue
            n = "" if uniform[task] else f" (n={result.num_samples})"
            cells += [f"{100 * result.accuracy:.1f}{n}", f"{result.tokens_per_step:.2f}"]
        body.append(cells)
    shown = [p for p in published if p.task in tasks]
    for model in dict.fromkeys(p.model for p in shown):
        by_task = {p.task: p for p in shown if p.model == model}
        body.append([model, "published"] + [cell for task in tasks for cell in (
            (f"{100 * by_task[task].accuracy:.1f}", f"{by_task[task].tokens_per_step:.2f}") if task in by_task
            else ("-", "-"))])
    early_stop = ", ".join(sorted({"on" if r.early_stop else "off" for r in results}))
    aup = aup_rows(results, shown)
    y_max = {row["task"]: row["y_max"] for row in aup}
    aup_body = [[model] + ["-" if row is None or row["aup"] is None else f"{row['aup']:.1f}"
                           for row in (next((r for r in aup if r["model"] == model and r["task"] == task), None)
                                       for task in tasks)]
                for model in dict.fromkeys(row["model"] for row in aup)]
    aup_table = markdown_table(["Model"] + [f"{task} AUP (y_max {y_max[task]:.1f})" for task in tasks], aup_body)
    published_note = (" Published rows: accuracy (%) and tokens per step as printed, measured with their paper's "
                      "protocol; one point each, so their AUP is tokens/step x accuracy.") if shown else ""
    return (markdown_table(header, body) + "\n\nAcc: percent of the n problems graded correct. Tokens/step: generated "
            f"tokens (no EOS, nothing after stop strings) per forward, ratio of totals; early stop: {early_stop}."
            f"{published_note}\n\n{aup_table}\n\nAUP: {AUP_DEFINITION}.")


def _label_slots() -> list[tuple[float, float, str, str]]:
    """Where a point's label may sit, in points from its marker, nearest first: above, right, below, left, then
    the diagonals, then the same further out (a crowded cluster stacks its labels)."""
    slots = []
    for distance in (5, 13, 21, 29, 37):
        slots += [(0, distance, "center", "bottom"), (distance, 0, "left", "center"), (0, -distance, "center", "top"),
                  (-distance, 0, "right", "center"), (distance * 0.8, distance * 0.8, "left", "bottom"),
                  (-distance * 0.8, distance * 0.8, "right", "bottom"), (distance * 0.8, -distance * 0.8, "left", "top"),
                  (-distance * 0.8, -distance * 0.8, "right", "top")]
    return slots


def _place_labels(axis: Any, points: Sequence[tuple[float, float, str, str]], renderer: Any) -> None:
    """Label every point at the first slot that stays inside the axes and overlaps no marker or earlier label
    (else the slot with the fewest overlaps), so labels neither collide nor get clipped; a label moved away from
    its marker gets a thin leader line."""
    frame = axis.get_window_extent(renderer)
    radius = 3.5 * axis.figure.dpi / 72  # the 6-point marker, plus a little air
    taken = [Bbox.from_extents(px - radius, py - radius, px + radius, py + radius)
             for px, py in axis.transData.transform([(x, y) for x, y, _, _ in points])]
    for x, y, text, color in points:
        best: tuple[tuple[bool, int], Any, Bbox] | None = None
        for dx, dy, ha, va in _label_slots():
            leader = {"arrowprops": {"arrowstyle": "-", "color": color, "lw": 0.5}} if max(abs(dx), abs(dy)) > 5 else {}
            label = axis.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                                  fontsize=7, color=color, annotation_clip=False, **leader)
            label.update_positions(renderer)
            box = Text.get_window_extent(label, renderer)  # the text alone, without its leader line
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            score = (not inside, sum(box.overlaps(other) for other in taken))
            if best is None or score < best[0]:
                if best is not None:
                    best[1].remove()
                best = (score, label, box)
            else:
                label.remove()
            if score == (False, 0):
                break
        taken.append(best[2])


def plot_frontier(results: Sequence[EvalResult], path: str | Path | None = None,
                  published: Sequence[PublishedResult] = ()) -> Figure:
    """Accuracy (%) against tokens per step, one panel per task (n in its title) and one line per model (the
    paper's Figures 3-4); each point is labelled with its swept value. Each ``published`` row of a panel's task
    is one square marker labelled with its method, its legend entry naming the source."""
    tasks = list(dict.fromkeys(r.task for r in results))
    shown = [p for p in published if p.task in tasks]
    models = list(dict.fromkeys(r.model for r in [*results, *shown]))  # one colour per model across panels
    # The object-oriented Figure API draws without pyplot, so the user's matplotlib backend is left alone.
    figure = Figure(figsize=(4.5 * len(tasks), 3.8), layout="constrained")
    renderer = FigureCanvasAgg(figure).get_renderer()
    axes = figure.subplots(1, len(tasks), squeeze=False)[0]
    labels: dict[Any, list[tuple[float, float, str, str]]] = {}
    for axis, task in zip(axes, tasks):
        in_task = [r for r in results if r.task == task]
        for model in dict.fromkeys(r.model for r in in_task):
            points = sorted((r for r in in_task if r.model == model), key=lambda r: r.tokens_per_step)
            color = f"C{models.index(model) % 10}"
            # clip_on=False: a marker at 0 % or 100 % is drawn whole on the frame instead of cut in half.
            axis.plot([r.tokens_per_step for r in points], [100 * r.accuracy for r in points], marker="o",
                      label=model, color=color, clip_on=False)
            labels.setdefault(axis, []).extend(
                (r.tokens_per_step, 100 * r.accuracy, r.setting.split()[-1], color) for r in points)
        for row in (p for p in shown if p.task == task):
            color = f"C{models.index(row.model) % 10}"
            axis.plot([row.tokens_per_step], [100 * row.accuracy], marker="s", linestyle="none", label=row.model,
                      color=color, clip_on=False)
            labels.setdefault(axis, []).append((row.tokens_per_step, 100 * row.accuracy, row.method, color))
        top = max(100 * r.accuracy for r in [*in_task, *shown] if r.task == task)
        axis.set_ylim(0, min(100.0, max(10.0, 1.25 * top)))  # accuracy lives in [0, 100]
        axis.margins(x=0.12)
        axis.set(title=f"{task} ({_sample_counts(in_task)})", xlabel="tokens per step", ylabel="accuracy (%)")
        axis.grid(alpha=0.3)
    # One legend below the panels: model names (paths, adapters) are often longer than a panel is wide.
    legend = {label: handle for axis in axes for handle, label in zip(*axis.get_legend_handles_labels())}
    parameter = SWEEP_PARAMETER[results[0].decoding["strategy"]]
    figure.legend(legend.values(), legend.keys(), loc="outside lower center", fontsize=8,
                  title=f"point labels: {parameter}" + ("; squares: published, labelled by method" if shown else ""),
                  title_fontsize=8)
    figure.draw_without_rendering()  # settle the layout, then place labels in their final pixel positions
    for axis, points in labels.items():
        _place_labels(axis, points, renderer)
    figure.set_layout_engine("none")  # keep the settled layout: the labels were placed for it
    if path is not None:
        figure.savefig(path, bbox_inches="tight", dpi=120)
    return figure
