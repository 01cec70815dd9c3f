"""The seed study's statistics and its pre-registered reading: Wilson and paired intervals, the claim rows (tokens
per step above MDLM in at least 4 of 5 seeds, the accuracy difference's interval including 0 or favouring TRIMS),
and the report."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...reports import write_atomic
from ..analysis import SPEARMAN_LABEL, results_by_seed, tokens_per_step_ratio
from ..protocol import BASE, VARIANTS
from .protocol import RegimeProtocol
from .records import answer_tokens, unit_record
from .seeds import seed_results


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval of a proportion (stays inside [0, 1] near 0 and 1, unlike the normal one; its ends are
    clipped there against float rounding)."""
    if not 0 <= correct <= n:
        raise ValueError(f"wilson: {correct} correct of {n}; needs 0 <= correct <= n.")
    if n == 0:
        return (math.nan, math.nan)
    phat, denominator = correct / n, 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denominator
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(a: Sequence[bool], b: Sequence[bool], z: float = 1.96) -> tuple[float, float, float]:
    """Mean of ``a - b`` over paired problems and its 95% normal interval: (mean, low, high)."""
    diffs = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return mean, mean - z * se, mean + z * se


MIN_SEEDS_ABOVE = 4
"""The reading: tokens per step above MDLM's in at least this many of the 5 seeds (scaled for other seed counts)."""


def claim_rows(results: Sequence[tuple[int, Any]], baseline: str = "MDLM") -> list[dict[str, Any]]:
    """The pre-registered reading per TRIMS variant and threshold: its tokens per step over MDLM's per seed, the
    seeds above 1, the accuracy difference to MDLM over the paired (seed, problem) records with its 95% interval,
    and ``holds``: above 1 in at least 4 of 5 seeds and an interval that includes 0 or favours TRIMS."""
    by_key = {(model, tau, seed): result for (model, tau), by_seed in results_by_seed(results).items()
              for seed, result in by_seed.items()}
    pairs = sorted({(model, tau) for model, tau, _ in by_key if model != baseline and VARIANTS.get(model, (False,))[0]},
                   key=lambda pair: (pair[1], list(VARIANTS).index(pair[0])))
    rows = []
    for model, tau in pairs:
        seeds = sorted(s for m, t, s in by_key if (m, t) == (model, tau) and (baseline, tau, s) in by_key)
        ratios = {s: tokens_per_step_ratio(by_key[model, tau, s], by_key[baseline, tau, s], s) for s in seeds}
        ours, theirs = [], []
        for s in seeds:
            mine = {sample.prompt_id: sample.correct for sample in by_key[model, tau, s].samples}
            base = {sample.prompt_id: sample.correct for sample in by_key[baseline, tau, s].samples}
            shared = sorted(set(mine) & set(base))
            ours += [mine[i] for i in shared]
            theirs += [base[i] for i in shared]
        mean, low, high = paired_difference(ours, theirs) if ours else (math.nan,) * 3
        above = sum(r > 1 for r in ratios.values())
        rows.append({"model": model, "threshold": tau, "seeds": seeds, "ratio_per_seed": ratios,
                     "mean_ratio": statistics.fmean(ratios.values()) if ratios else math.nan,
                     "seeds_above": above, "accuracy_difference": mean, "difference_interval": [low, high],
                     "paired_problems": len(ours),
                     "holds": bool(seeds) and above >= math.ceil(MIN_SEEDS_ABOVE / 5 * len(seeds)) and high >= 0})
    return rows


T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
"""Student's t 97.5% quantiles by degrees of freedom (any statistics table): a 95% interval over a few seeds."""


def t_975(degrees: int) -> float:
    """Student's t 97.5% quantile: :data:`T_975` to 10 degrees of freedom, past it the Cornish-Fisher expansion
    around the normal quantile to 1/df^4 (within 5e-6 of the exact quantile from 11 on)."""
    if degrees in T_975:
        return T_975[degrees]
    z, v = 1.959963984540054, float(degrees)
    terms = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96, (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
             (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
    return z + sum(term / v ** (k + 1) for k, term in enumerate(terms))


def seed_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean of per-seed values and its 95% t-interval over the seeds: (mean, low, high); NaN ends for one seed, and
    all NaN where a seed's value is NaN (a reading it could not make)."""
    if not values:
        raise ValueError("seed_interval: no values; needs one per seed.")
    if any(math.isnan(value) for value in values):
        return math.nan, math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = t_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def frontier_rows(results: Sequence[tuple[int, Any]], baseline: str = "MDLM") -> list[dict[str, Any]]:
    """The frontier reading per TRIMS variant (docs/regime.md, studies 10-12): per seed the AUP of the variant's and of
    MDLM's (tokens per step, accuracy) points, both against the better of the two's best accuracy in that seed; the
    difference's mean over seeds with its 95% t-interval (``above`` / ``below`` when it excludes 0); and, per
    threshold, the MDLM thresholds whose point (tokens per step mean over seeds, accuracy pooled; both over the seeds
    the two thresholds' runs share, so a partial report compares like with like) dominates the variant's: at least
    its tokens per step and accuracy, one of them strictly."""
    from ...evaluation.aup import accuracy_under_parallelism

    pooled = results_by_seed(results)  # (model, threshold) -> seed -> result, each run once
    points: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for seed, result in results:
        points.setdefault((result.model, seed), []).append((result.tokens_per_step, 100 * result.accuracy))

    def point(model: str, tau: float, seeds: set[int]) -> tuple[float, float]:
        runs = [pooled[model, tau][seed] for seed in sorted(seeds)]
        correct = sum(sample.correct for r in runs for sample in r.samples)
        return statistics.fmean(r.tokens_per_step for r in runs), correct / max(1, sum(len(r.samples) for r in runs))

    rows = []
    for model in dict.fromkeys(r.model for _, r in results):
        if model == baseline or not VARIANTS.get(model, (False,))[0]:
            continue
        seeds = sorted(s for m, s in points if m == model and (baseline, s) in points)
        differences = {}
        for seed in seeds:
            ours, theirs = points[model, seed], points[baseline, seed]
            y_max = max(accuracy for _, accuracy in ours + theirs)
            differences[seed] = (accuracy_under_parallelism(ours, y_max=y_max)
                                 - accuracy_under_parallelism(theirs, y_max=y_max))
        mean, low, high = seed_interval(list(differences.values())) if differences else (math.nan,) * 3
        dominated = {}
        for tau in sorted(t for m, t in pooled if m == model):
            dominated[tau] = []
            for t in sorted(t for m, t in pooled if m == baseline):
                if shared := pooled[model, tau].keys() & pooled[baseline, t].keys():
                    (speed, accuracy), other = point(model, tau, shared), point(baseline, t, shared)
                    if other[0] >= speed and other[1] >= accuracy and other != (speed, accuracy):
                        dominated[tau].append(t)
        rows.append({"model": model, "seeds": seeds, "aup_difference_per_seed": differences, "aup_difference": mean,
                     "interval": [low, high], "frontier": "above" if low > 0 else "below" if high < 0 else "not apart",
                     "dominated_by_mdlm": dominated})
    return rows


def format_frontier(rows: Sequence[Mapping[str, Any]]) -> str:
    """The frontier reading as a Markdown table."""
    lines = ["| model | AUP minus MDLM's per seed | mean (95% interval) | frontier | thresholds where an MDLM point "
             "dominates |", "|---|---|---|---|---|"]
    for row in rows:
        low, high = row["interval"]
        dominated = "; ".join(f"{tau} (by MDLM at {', '.join(map(str, by))})" for tau, by in
                              row["dominated_by_mdlm"].items() if by) or "none"
        lines.append(f"| {row['model']} | {', '.join(f'{d:+.1f}' for d in row['aup_difference_per_seed'].values())} | "
                     f"{row['aup_difference']:+.1f} ({low:+.1f}, {high:+.1f}) | {row['frontier']} | {dominated} |")
    return "\n".join(lines)


def format_claim(rows: Sequence[Mapping[str, Any]]) -> str:
    """The reading as a Markdown table."""
    lines = ["| threshold | model | tokens/step ratio to MDLM per seed | above 1 | accuracy difference (95% interval) | "
             "holds |", "|---|---|---|---|---|---|"]
    for row in rows:
        ratios = ", ".join(f"{r:.3f}" for r in row["ratio_per_seed"].values())
        low, high = row["difference_interval"]
        lines.append(f"| {row['threshold']} | {row['model']} | {ratios} (mean {row['mean_ratio']:.3f}) | "
                     f"{row['seeds_above']} of {len(row['seeds'])} | {100 * row['accuracy_difference']:+.1f} points "
                     f"({100 * low:+.1f}, {100 * high:+.1f}) | {'**yes**' if row['holds'] else 'no'} |")
    return "\n".join(lines)


def accuracy_rows(results: Sequence[tuple[int, Any]]) -> list[dict[str, Any]]:
    """Per model and threshold, pooled over seeds: accuracy with Wilson's 95% interval, tokens per step (mean over
    seeds), AUP per seed over the model's thresholds (mean), the seeds. A seed's AUPs share one y_max, the best
    accuracy of any model in that seed, so every model's AUP moves when a model is added (the frontier reading's
    y_max is the best of the pair)."""
    from ...evaluation.aup import accuracy_under_parallelism

    groups = {key: list(by_seed.items()) for key, by_seed in results_by_seed(results).items()}
    y_max = {seed: max(100 * r.accuracy for s, r in results if s == seed) for seed, _ in results}
    aup: dict[str, list[float]] = {}
    for model in dict.fromkeys(r.model for _, r in results):
        for seed in sorted({s for s, r in results if r.model == model}):
            points = [(r.tokens_per_step, 100 * r.accuracy) for s, r in results if s == seed and r.model == model]
            aup.setdefault(model, []).append(accuracy_under_parallelism(points, y_max=y_max[seed]))
    rows = []
    for (model, tau), runs in groups.items():
        correct = sum(sample.correct for _, r in runs for sample in r.samples)
        n = sum(len(r.samples) for _, r in runs)
        rows.append({"model": model, "threshold": tau, "seeds": [s for s, _ in runs], "problems": n,
                     "accuracy": correct / n if n else math.nan, "interval": list(wilson(correct, n)),
                     "tokens_per_step": statistics.fmean(r.tokens_per_step for _, r in runs),
                     "answer_tokens": statistics.fmean(answer_tokens(r) for _, r in runs),
                     "aup": statistics.fmean(aup[model]) if aup.get(model) else math.nan})
    return sorted(rows, key=lambda r: (r["threshold"], [BASE, *VARIANTS].index(r["model"])))


def format_accuracy(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| threshold | model | seeds | problems | accuracy % (95% interval) | tokens/step | tokens/answer | "
             "AUP (mean over seeds) |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        low, high = row["interval"]
        lines.append(f"| {row['threshold']} | {row['model']} | {len(row['seeds'])} | {row['problems']} | "
                     f"{100 * row['accuracy']:.1f} ({100 * low:.1f}-{100 * high:.1f}) | {row['tokens_per_step']:.2f} | "
                     f"{row['answer_tokens']:.1f} | {row['aup']:.1f} |")
    return "\n".join(lines)


def write_seed_report(output: Path, protocol: RegimeProtocol, seeds: Sequence[int]) -> Path:
    """``output/report``: ``study.md`` (accuracy with intervals, the reading, the probes and decode-order Spearman per
    seed) and ``study.json`` from every finished evaluation of every seed; partial while some are missing."""
    from ..study import models_plan

    results = seed_results(output, protocol, seeds)
    planned = sum(unit.threshold is not None for unit in models_plan(protocol)) * len(seeds)
    claims, accuracy, frontier = claim_rows(results), accuracy_rows(results), frontier_rows(results)
    probes, spearman, correlated = {}, {}, {}
    for seed in seeds:
        folder = output / f"seed-{seed}"
        if (folder / "probe" / "unit.json").is_file():
            probes[seed] = unit_record(folder, "probe")["levels"]
        for trace in sorted(folder.glob("eval/*/tau*/trace.json")):
            name = next(m for m in [BASE, *VARIANTS] if trace.parent.parent.name in ("base", f"{slug_of(m)}-seed{seed}"))
            document = json.loads(trace.read_text())
            spearman.setdefault(name, {})[seed] = document["nll_vs_decode_step_spearman"]
            if "correlated_problems" in document:  # traces written before the count was kept show none
                correlated.setdefault(name, {})[seed] = f" ({document['correlated_problems']} of " \
                                                        f"{document['traced_problems']})"
    report = output / "report"
    report.mkdir(parents=True, exist_ok=True)
    head = (f"PARTIAL: {len(results)} of {planned} evaluations finished.\n\n" if len(results) < planned else "")
    level = protocol.test_level
    probe_lines = "\n".join(f"- seed {seed}: " + ", ".join(f"level {lv} {100 * v['accuracy']:.1f}% "
                                                           f"({v['answer_tokens']:.1f} tokens/answer)"
                                                           for lv, v in levels.items())
                            for seed, levels in probes.items())
    order = "\n".join(f"- {name}: " + ", ".join(f"seed {s} {'-' if v is None else f'{v:+.2f}'}"
                                                f"{correlated.get(name, {}).get(s, '')}" for s, v in by_seed.items())
                      for name, by_seed in spearman.items())
    text = (f"{head}Seeds {list(seeds)}, one base per seed; level {level}, {protocol.test_problems} test problems per "
            f"cell and seed.\n\nBase alone on the selection problems (tau {protocol.selection_threshold}):\n\n"
            f"{probe_lines}\n\nAccuracy (pooled over seeds, Wilson 95% interval), tokens per step (mean over seeds), "
            f"AUP:\n\n{format_accuracy(accuracy)}\n\nThe pre-registered reading (\"TRIMS raises tokens per step at "
            f"equal accuracy\" holds at a threshold when the ratio to MDLM is above 1 in at least 4 of 5 seeds and the "
            f"accuracy difference's 95% interval includes 0 or favours TRIMS):\n\n{format_claim(claims)}\n\n"
            f"The frontier (AUP of the variant minus MDLM's per seed, both against the pair's best accuracy; 95% "
            f"t-interval over seeds; MDLM points at least as fast and as accurate):\n\n{format_frontier(frontier)}\n\n"
            f"{SPEARMAN_LABEL} at tau {protocol.trace_threshold()}, mean over the traced problems it is defined on "
            f"(of how many, in brackets; negative: hard tokens first):\n\n{order}\n")
    write_atomic(report / "study.md", text)
    write_atomic(report / "study.json", json.dumps({"protocol": dataclasses.asdict(protocol), "seeds": list(seeds),
                                                    "evaluations": len(results), "planned": planned,
                                                    "accuracy": accuracy, "claim": claims, "frontier": frontier,
                                                    "probes": probes,
                                                    "spearman": spearman}, indent=1, default=str))
    return report / "study.md"


def slug_of(name: str) -> str:
    from ..study import slug

    return slug(name)
