"""The mechanism: what a study's trajectory rows taught. Per seed, every model's confidence on the future buckets with
the context buckets revealed and with everything masked, each TRIMS variant against MDLM, and the decoder's commits by
teacher bucket (``regime.py mechanism``; :mod:`trims_hf.studies.mechanism` measures)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...reports import write_atomic
from ..protocol import VARIANTS, check_protocol
from .protocol import RegimeProtocol
from .reading import seed_interval
from .records import unit_record

MECHANISM_ROWS = 200
"""Held-out test problems (the first of the test level's) the mechanism reads every model on: one forward of K reads a
problem and model."""


def seed_mechanism(folder: Path, protocol: RegimeProtocol, rows: int = MECHANISM_ROWS) -> dict[str, Any]:
    """The mechanism's readings of one seed's study (``folder/mechanism``, a unit kept under the protocol's
    fingerprint): the first ``rows`` test problems scored by the study's teacher, cut into K equal-mass buckets in each
    TRIMS variant's ordering, and :func:`trims_hf.studies.mechanism.measure_future_gain` of the variant and of MDLM in that
    ordering (``gain``: ``{ordering: {model: FutureGain.as_dict()}}``); and every model's
    :func:`trims_hf.studies.mechanism.decode_commit_profile` on the first ``trace_samples`` of them at the trace threshold, in
    hard-to-easy buckets cut over the ``rows`` problems (``commits``: ``{model: profile}``)."""
    from datasets import Dataset, load_dataset

    from ...data.buckets import bucket_rows
    from ...data.schema import STUDENT_SCORE, as_prompt_completion
    from ...evaluation.tasks.base import read_json_rows
    from ..arith import ArithTask
    from ..mechanism import decode_commit_profile, measure_future_gain
    from ..stages import prepared_rows, score_rows
    from ..study import slug
    from .study import RegimeStudy

    study, target = RegimeStudy(folder, protocol), folder / "mechanism"
    if study.units.finished(target, "mechanism"):
        record = unit_record(folder, "mechanism")
        if record["requested_rows"] == rows:
            return {key: record[key] for key in ("gain", "commits")}
    trained = [name for name in ("MDLM", *protocol.variants) if name in VARIANTS]
    missing = [name for name in trained if not (folder / "variants" / f"{slug(name)}-seed{protocol.seed}").is_dir()]
    if missing or "MDLM" not in trained:
        raise ValueError(f"{folder}: no trained {', '.join(missing) or 'MDLM'} yet (run the study first).")
    shutil.rmtree(target, ignore_errors=True)  # measured under another row count: read again
    study.units.unit(target, "mechanism", timed=False)
    started = time.perf_counter()
    test = read_json_rows(folder / "data" / f"test-L{protocol.test_level}.jsonl")[:rows]
    teacher = study.load_teacher()
    score_rows(protocol, as_prompt_completion(Dataset.from_list(test), "question", "answer"), target / "scored",
               teacher, study.teacher_name, study.source)
    scored, tokenizer = load_dataset(str(target / "scored"), split="train"), study.tokenizer()
    models = {name: study.load_student(folder / "variants" / f"{slug(name)}-seed{protocol.seed}").eval()
              for name in trained}
    gain: dict[str, dict[str, Any]] = {}
    for name in trained:
        trajectory, ordering = VARIANTS[name]
        if trajectory:
            prepared = list(prepared_rows(protocol, scored, tokenizer, ordering))
            gain[ordering] = {model: measure_future_gain(models[model], prepared, protocol.masking.num_buckets)
                              .as_dict() for model in ("MDLM", name)}
    hard_first = prepared_rows(protocol, scored, tokenizer, "hard_to_easy")
    _, thresholds = bucket_rows(hard_first[STUDENT_SCORE], protocol.bucket_config("hard_to_easy"))
    traced = ArithTask(test[: protocol.trace_samples], name=f"chain-L{protocol.test_level}")
    decoding = protocol.decoding_at(protocol.trace_threshold())
    commits = {name: decode_commit_profile(model, tokenizer, traced, decoding, teacher, protocol.teacher_context,
                                           thresholds, protocol.masking.num_buckets) for name, model in models.items()}
    study.units.done(target, "mechanism", started, {"requested_rows": rows, "rows": len(test), "gain": gain,
                                                    "commits": commits, "thresholds": thresholds.tolist()})
    return {"gain": gain, "commits": commits}


def mechanism_rows(readings: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per TRIMS variant, from each seed's :func:`seed_mechanism`: the gains (revealed minus all masked) of the
    variant and of MDLM read in the variant's ordering, means over seeds, and the variant minus MDLM per seed with its
    95% t-interval; ``raised``: the log-probability gain's interval above 0 (the registered reading)."""
    rows = []
    for name, (trajectory, ordering) in VARIANTS.items():
        seeds = sorted(seed for seed, by_ordering in readings.items() if name in by_ordering.get(ordering, {}))
        if not trajectory or not seeds:
            continue
        row: dict[str, Any] = {"model": name, "ordering": ordering, "seeds": seeds}
        for score in ("logprob", "confidence"):
            pooled = {model: [readings[s][ordering][model]["pooled"] for s in seeds] for model in ("MDLM", name)}
            for model, key in (("MDLM", "mdlm"), (name, "variant")):
                for reading in ("revealed", "masked", "gain"):
                    row[f"{key}_{reading}_{score}"] = statistics.fmean(r[f"{reading}_{score}"] for r in pooled[model])
            differences = [v[f"gain_{score}"] - m[f"gain_{score}"] for v, m in zip(pooled[name], pooled["MDLM"])]
            mean, low, high = seed_interval(differences)
            row[f"difference_{score}"] = {"per_seed": dict(zip(seeds, differences)), "mean": mean,
                                          "interval": [low, high]}
        row["raised"] = bool(row["difference_logprob"]["interval"][0] > 0)
        rows.append(row)
    return rows


def format_mechanism(rows: Sequence[Mapping[str, Any]]) -> str:
    """The mechanism table: per variant, the future tokens' log-probability (and confidence) with the context revealed
    and with everything masked, the gain, for MDLM and the variant, and the variant's gain over MDLM's."""
    lines = ["| model (ordering) | seeds | MDLM log-prob revealed / masked / gain | variant's | gain over MDLM's per seed "
             "| mean (95% interval) | confidence gain over MDLM's, mean (95% interval) | raised |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        log, conf = row["difference_logprob"], row["difference_confidence"]
        lines.append(
            f"| {row['model']} ({row['ordering']}) | {len(row['seeds'])} | "
            + " / ".join(f"{row[f'mdlm_{r}_logprob']:+.3f}" for r in ("revealed", "masked", "gain")) + " | "
            + " / ".join(f"{row[f'variant_{r}_logprob']:+.3f}" for r in ("revealed", "masked", "gain")) + " | "
            + ", ".join(f"{d:+.3f}" for d in log["per_seed"].values())
            + f" | {log['mean']:+.3f} ({log['interval'][0]:+.3f}, {log['interval'][1]:+.3f}) | "
            f"{conf['mean']:+.3f} ({conf['interval'][0]:+.3f}, {conf['interval'][1]:+.3f}) | "
            f"{'**yes**' if row['raised'] else 'no'} |")
    return "\n".join(lines)


def commit_rows(commits: Mapping[int, Mapping[str, Sequence[Mapping[str, float]]]]) -> list[dict[str, Any]]:
    """Per model and hard-to-easy bucket, from each seed's ``commits``: tokens (summed), and the mean over seeds of the
    mean steps into the block at commit and of the confidence at commit."""
    rows = []
    for name in dict.fromkeys(name for by_model in commits.values() for name in by_model):
        seeds = [seed for seed, by_model in commits.items() if name in by_model]
        for k, _ in enumerate(commits[seeds[0]][name]):
            parts = [commits[seed][name][k] for seed in seeds]
            rows.append({"model": name, "bucket": k, "seeds": seeds, "tokens": sum(p["tokens"] for p in parts),
                         **{key: statistics.fmean(v) if (v := [p[key] for p in parts if not math.isnan(p[key])])
                            else math.nan for key in ("lateness", "confidence")}})
    return rows


def format_commits(rows: Sequence[Mapping[str, Any]]) -> str:
    """Steps into the block at commit per bucket, one line per model (bucket 0 the hardest), confidence beside."""
    buckets = sorted({row["bucket"] for row in rows})
    lines = ["| model | " + " | ".join(f"bucket {k}" for k in buckets) + " |", "|---|" + "---|" * len(buckets)]
    for name in dict.fromkeys(row["model"] for row in rows):
        cells = {row["bucket"]: row for row in rows if row["model"] == name}
        lines.append(f"| {name} | " + " | ".join(f"{cells[k]['lateness']:.2f} ({cells[k]['confidence']:.2f})"
                                                 for k in buckets) + " |")
    return "\n".join(lines)


def write_mechanism_report(output: Path, protocol: RegimeProtocol, seeds: Sequence[int],
                           rows: int = MECHANISM_ROWS) -> Path:
    """``output/report/mechanism.md`` and ``mechanism.json``: :func:`seed_mechanism` of every seed whose models are
    trained (measured now where not yet), then :func:`mechanism_rows` and :func:`commit_rows`."""
    readings = {}
    for seed in seeds:
        folder, p = output / f"seed-{seed}", dataclasses.replace(protocol, seed=seed)
        check_protocol(folder, p)
        readings[seed] = seed_mechanism(folder, p, rows)
    table = mechanism_rows({seed: reading["gain"] for seed, reading in readings.items()})
    commits = commit_rows({seed: reading["commits"] for seed, reading in readings.items()})
    report = output / "report"
    report.mkdir(parents=True, exist_ok=True)
    text = (f"Seeds {list(seeds)}; the first {rows} test problems of level {protocol.test_level}, scored by the "
            f"study's teacher, in {protocol.masking.num_buckets} buckets of each variant's ordering. Per threshold k, "
            f"the future tokens (bucket > k) read with the context (bucket <= k) revealed and with every answer token "
            f"masked; log-probability of the right token, pooled over rows, thresholds and tokens; gain = revealed "
            f"minus masked. Raised: the variant's gain minus MDLM's has a 95% t-interval over seeds above 0.\n\n"
            f"{format_mechanism(table)}\n\nThe decoder's commits at tau {protocol.trace_threshold()} on the first "
            f"{protocol.trace_samples} of those problems, by hard-to-easy teacher bucket (0 the hardest): steps into "
            f"the block at commit (confidence at commit), mean over seeds. Hard-first decoding: lateness falling "
            f"towards bucket 0.\n\n{format_commits(commits)}\n")
    write_atomic(report / "mechanism.md", text)
    write_atomic(report / "mechanism.json", json.dumps({"seeds": list(seeds), "rows": rows, "table": table,
                                                        "commits": commits, "readings": readings}, indent=1,
                                                       default=str))
    return report / "mechanism.md"
