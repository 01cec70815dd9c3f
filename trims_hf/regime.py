"""Where TRIMS can be judged: a student that gets the answers right, found on the MDLM base alone, then the seed study.

"More tokens per step at equal accuracy" says nothing when every model is at the floor (the demo's from-scratch
students solve 3-13% of their problems; SmolLM2's window 1 base solved 6%). So the regime is chosen first, on the MDLM
base alone and before any TRIMS variant, by a rule written down before the curve ran (docs/regime.md):

* :class:`RegimeProtocol` / :class:`RegimeStudy`: the library's study runner on the arithmetic chain problems
  (:func:`trims_hf.tasks.arith.make_problem` with ``chain_steps``: long answers, mostly template, a few uncertain
  tokens) at several difficulty levels, with a tiny causal Llama trained here as the pretrained model and teacher;
  its ``probe`` stage measures the base on each level's held-out selection problems.
* :func:`run_curve`: the probe over a grid of knobs (student size, batch, base steps), cheapest first;
  :func:`choose` applies the pre-registered rule to its points.
* :func:`run_seeds`: the study in the chosen regime, one base per seed (each seed its own folder, the data, the
  pretrained model and the teacher's scores shared), and :func:`claim_rows`, the pre-registered reading.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .protocol import (
    BASE,
    BUCKET_FIELDS,
    MDLM_MASKING_FIELDS,
    VARIANTS,
    LeveledOneSeedProtocol,
    StudyProtocol,
    check_protocol,
    record_protocol,
)
from .reports import write_atomic
from .settings import DecodingConfig, StudentFormat

DATA_FIELDS = ("levels", "chain_steps", "train_per_level", "selection_per_level", "test_problems", "data_seed")
PRETRAINED_FIELDS = (*DATA_FIELDS, "student_format", "hidden_size", "num_layers", "num_heads", "pretrain_steps",
                     "pretrain_lr", "pretrain_batch_size", "threads")
SCORE_FIELDS = (*PRETRAINED_FIELDS, *BUCKET_FIELDS)
BASE_FIELDS = (*PRETRAINED_FIELDS, *MDLM_MASKING_FIELDS, "base_steps", "base_lr", "batch_size", "anneal_steps", "seed")
PROBE_FIELDS = (*BASE_FIELDS, "decoding", "selection_threshold", "eval_batch_size")


@dataclass(frozen=True)
class RegimeProtocol(LeveledOneSeedProtocol):
    """The regime study's protocol: the task (chain problems at several levels), the tiny student's size, the
    pretrained model's and the base's training, and the pre-registered targets of the regime rule."""

    student_format: StudentFormat = field(default_factory=lambda: StudentFormat(max_length=160))
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(gen_length=96, block_length=32,
                                                                            cache="dual"))
    """Fast-dLLM threshold decoder, dual cache, early stop; 96 tokens hold the longest level-2 answers (~70)."""
    levels: tuple[int, ...] = (1, 2)
    """Difficulty levels (:func:`~trims_hf.tasks.arith.level_scale`: level 2 draws 4x larger numbers); the training
    rows mix them, and each has its own held-out selection and test problems."""
    chain_steps: int = 3
    """Steps of a chain problem: 3 give answers of ~55 tokens at level 1."""
    train_per_level: int = 2000
    selection_per_level: int = 200
    """Held-out problems per level on which the base alone is measured (the probe)."""
    test_problems: int = 500
    """Held-out problems of :attr:`test_level` every model of the study is evaluated on."""
    data_seed: int = 0
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    pretrain_steps: int = 400
    """Autoregressive steps of the tiny Llama that is the pretrained model (the student's start) and the teacher."""
    pretrain_lr: float = 1e-3
    pretrain_batch_size: int = 32
    batch_size: int = 16
    base_steps: int = 1000
    base_lr: float = 1e-3
    anneal_steps: int = 0
    """The base's first steps over which its attention turns from causal to bidirectional (DiffuLLaMA's annealing,
    :class:`~trims_hf.annealing.AttentionAnnealing`); 0: bidirectional from the first step."""
    variant_steps: int = 250
    variant_lr: float = 3e-4
    eval_batch_size: int = 500
    trace_samples: int = 16
    seed: int = 0
    """The base's and its variants' training seed: one base per seed."""
    test_level: int = 1
    """The level the study's models are evaluated on (the curve's choice)."""
    selection_threshold: float = 0.9
    target_accuracy: float = 0.6
    """The regime rule: the base reaches this on a level's selection problems at :attr:`selection_threshold`..."""
    min_answer_tokens: float = 48.0
    """... its answers there are at least this many generated tokens on average ..."""
    min_hard_share: float = 0.5
    """... and the hardest 1/K of the training completion tokens (teacher NLL) hold at least this share of the
    teacher's NLL: a few hard tokens among mostly predictable ones."""
    threads: int = 1
    """torch CPU threads (they decide float results); 1 because two threads on two shared cores ran 6x slower."""

    EVALUATE_BASE = False
    """The probe measures the base (on the selection problems) before any variant; the study's evaluations are the
    four models' only."""
    STAGE_FIELDS = {"data": DATA_FIELDS, "pretrained": PRETRAINED_FIELDS, "score": SCORE_FIELDS, "base": BASE_FIELDS,
                    "probe": PROBE_FIELDS}

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = (
        "chain_steps", "train_per_level", "selection_per_level", "test_problems", "hidden_size", "num_layers",
        "num_heads", "pretrain_steps", "pretrain_batch_size", "threads", *StudyProtocol.POSITIVE_FIELDS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.test_level not in self.levels:
            raise ValueError(f"test_level={self.test_level}: must be one of levels {self.levels}.")

    def parameters(self) -> int:
        """The tiny Llama's parameters without its (tied) embedding: what a training token's cost scales with."""
        h = self.hidden_size
        return self.num_layers * (4 * h * h + 3 * h * 3 * h)

    def cost(self) -> float:
        """The training cost of the base and its pretrained model, the curve's order: rows seen x parameters (FLOPs up
        to a constant)."""
        rows = self.base_steps * self.batch_size + self.pretrain_steps * self.pretrain_batch_size
        return float(rows * self.parameters())


def make_regime_study(output: Path, protocol: RegimeProtocol, deadline: float = math.inf) -> Any:
    """The study of ``protocol`` in ``output`` (built here so that importing this module loads no torch)."""
    from .schema import as_prompt_completion
    from .study import Study
    from .tasks.arith import ArithTask, draw_unique
    from .tasks.base import read_json_rows, write_json_rows

    class RegimeStudy(Study):
        stages = ("data", "pretrained", "score", "base", "probe", "models", "report")
        source = "trims_hf.regime"
        teacher_name = "the pretrained tiny Llama"

        def stage_data(self) -> None:
            """Held-out selection and test rows per level, then train rows of every level shuffled together; every
            question appears once over all of them. The tokenizer is built over all texts."""
            from datasets import Dataset

            from .tiny import build_tokenizer

            folder, p = self.output / "data", self.protocol
            if not self.units.unit(folder, "data", "data"):
                return
            started, train, taken = time.perf_counter(), [], set()
            streams = {level: random.Random(p.data_seed + level) for level in p.levels}
            texts = []
            for level in p.levels:
                held_out = draw_unique(streams[level], level, p.selection_per_level + p.test_problems, taken,
                                       p.chain_steps)
                write_json_rows(folder / f"selection-L{level}.jsonl", held_out[: p.selection_per_level])
                write_json_rows(folder / f"test-L{level}.jsonl", held_out[p.selection_per_level :])
                texts += held_out
            for level in p.levels:
                train += draw_unique(streams[level], level, p.train_per_level, taken, p.chain_steps)
            random.Random(p.data_seed).shuffle(train)
            write_json_rows(folder / "train.jsonl", as_prompt_completion(Dataset.from_list(train), "question", "answer"))
            build_tokenizer(r["question"] + "\n" + r["answer"] for r in texts + train).save_pretrained(folder / "tokenizer")
            self.units.done(folder, "data", started, {"train_rows": len(train)}, stage="data")

        def stage_pretrained(self) -> None:
            """The tiny causal Llama trained autoregressively on the training rows: the student's start, the teacher."""
            self.pretrain_tiny(self.protocol.pretrain_steps, self.protocol.pretrain_lr, self.protocol.pretrain_batch_size)

        def stage_probe(self) -> None:
            """The base alone on each level's selection problems at ``selection_threshold``: accuracy, generated tokens
            per answer and tokens per step (what the regime rule reads), before any variant."""
            folder = self.output / "probe"
            if not self.units.unit(folder, "probe", "probe"):
                return
            started = time.perf_counter()
            levels = {}
            for level, (result, copies) in probe_levels(self, folder, "chain").items():
                levels[level] = {"accuracy": result.accuracy, "answer_tokens": answer_tokens(result),
                                 "tokens_per_step": result.tokens_per_step, "problems": result.num_samples,
                                 "copies": copies}
                print(f"level {level}: base accuracy {result.accuracy:.3f}, {levels[level]['answer_tokens']:.1f} "
                      f"tokens per answer (n={result.num_samples})", flush=True)
            self.units.done(folder, "probe", started, {"levels": levels}, stage="probe")

        def before_base_training(self, model: Any) -> dict[str, Any]:
            if not self.protocol.anneal_steps:
                return {}
            from .annealing import AttentionAnnealing

            AttentionAnnealing(model, self.protocol.anneal_steps, seed=self.protocol.seed)
            return {"attention_anneal_steps": self.protocol.anneal_steps}

        def test_task(self) -> Any:
            level = self.protocol.test_level
            return ArithTask(read_json_rows(self.output / "data" / f"test-L{level}.jsonl"), name=f"chain-L{level}")

        def eval_tag(self) -> str:
            return f" L{self.protocol.test_level}"

        def report_extra(self) -> dict[str, Any]:
            return {"probe": unit_record(self.output, "probe")}

    return RegimeStudy(output, protocol, "cpu", deadline)


def probe_levels(study: Any, folder: Path, task: str) -> dict[int, tuple[Any, dict[str, Any]]]:
    """The study's base alone on each level's selection problems (``data/selection-L<level>.jsonl``), before any
    variant: its evaluation at ``selection_threshold`` (saved as ``folder/L<level>.json``) and its
    :func:`result_recall` on the first :data:`COPIES_ROWS` of them; what the regime's probe and SmolLM2's level
    selection read."""
    from .evaluation import evaluate_task
    from .results import save_results
    from .study import on_device
    from .tasks.arith import ArithTask
    from .tasks.base import read_json_rows

    p, tokenizer = study.protocol, study.tokenizer()
    model = on_device(study.load_student(study.output / "base"), study.device)
    probed = {}
    for level in p.levels:
        rows = read_json_rows(study.output / "data" / f"selection-L{level}.jsonl")
        result = evaluate_task(model, tokenizer, ArithTask(rows, name=f"{task}-L{level} selection"),
                               p.decoding_at(p.selection_threshold), batch_size=p.eval_batch_size, model_name=BASE)
        save_results([result], folder / f"L{level}.json")
        probed[level] = result, result_recall(model, tokenizer, rows[:COPIES_ROWS], p.student_format)
    return probed


def answer_tokens(result: Any) -> float:
    """Mean generated tokens per answer (no EOS, nothing after a stop string) of an evaluation."""
    return statistics.fmean(sample.non_eos_tokens for sample in result.samples) if result.samples else 0.0


def unit_record(folder: Path, unit: str) -> dict[str, Any]:
    """What a finished unit recorded (``unit.json``)."""
    return json.loads((folder / unit / "unit.json").read_text())


# -- does the base compute its results or copy them? ---------------------------------------------------------------------
RECALL_VIEWS = ("rest visible", "later numbers masked", "left to right")
"""What a solution line's result (``= N``) is read against (:func:`result_masks`): the rest of the answer visible (a
later line may repeat the result: copying is enough); the template visible but every number from the result on masked
(what the threshold decoder leaves when it commits the template first: the result must be computed); everything from
the result on masked (left-to-right decoding)."""
RESULT = re.compile(r"= (\d+)")
COPIES_ROWS = 100
"""Held-out problems a probe reads :func:`result_recall` on (one forward per problem)."""


def result_masks(completion_spans: Sequence[tuple[int, int]], answer: str, prompt_length: int,
                 length: int) -> list[tuple[list[int], dict[str, list[int]]]]:
    """For each result of ``answer`` (``= N``): its token positions and, per :data:`RECALL_VIEWS`, the positions masked
    in that view. ``completion_spans`` are the completion tokens' character spans (``tokenize_example``); ``length``
    is the tokenised row's length (end-of-response tokens count as "after")."""
    def tokens(a: int, b: int) -> list[int]:  # the tokens overlapping characters [a, b) (a digit's may hold a space)
        return [prompt_length + i for i, (s, e) in enumerate(completion_spans) if s < b and e > a]

    in_number = {p for m in re.finditer(r"\d+", answer) for p in tokens(*m.span())}
    found = []
    for match in RESULT.finditer(answer):
        positions = tokens(*match.span(1))
        if not positions:
            continue
        first = positions[0]
        found.append((positions, {RECALL_VIEWS[0]: positions,
                                  RECALL_VIEWS[1]: sorted({*positions, *(p for p in in_number if p > first)}),
                                  RECALL_VIEWS[2]: list(range(first, length))}))
    return found


def result_recall(model: Any, tokenizer: Any, rows: Sequence[Mapping[str, str]],
                  fmt: StudentFormat | None = None) -> dict[str, Any]:
    """The share of solution-line results a student predicts exactly (every digit its argmax) in each of
    :data:`RECALL_VIEWS`, from one forward per problem: high with the rest visible and low with the later numbers masked
    says the student copies results from where the answer repeats them instead of computing them."""
    import torch

    from .preparation import tokenize_example
    from .students import mask_token_id, student_spec

    spec, mask = student_spec(model), mask_token_id(model)
    right = dict.fromkeys(RECALL_VIEWS, 0)
    total = 0
    for index, row in enumerate(rows):
        example = tokenize_example(tokenizer, row["question"], row["answer"], fmt, index)
        ids = torch.tensor(example.input_ids)
        cases = result_masks(example.completion_spans, row["answer"], example.prompt_length, len(ids))
        if not cases:
            continue
        batch = ids.repeat(len(cases) * len(RECALL_VIEWS), 1)  # on the CPU; the forward on the model's device
        for case, (_, views) in enumerate(cases):
            for view, name in enumerate(RECALL_VIEWS):
                batch[case * len(RECALL_VIEWS) + view, views[name]] = mask
        with torch.no_grad():
            logits = model(input_ids=batch.to(next(model.parameters()).device)).logits
            predicted = spec.align_logits(logits).argmax(-1).cpu()
        for case, (positions, _) in enumerate(cases):
            for view, name in enumerate(RECALL_VIEWS):
                right[name] += bool(torch.equal(predicted[case * len(RECALL_VIEWS) + view, positions], ids[positions]))
        total += len(cases)
    if not total:
        raise ValueError("no solution line of these rows has a result ('= N') to read")
    return {"results": total, "problems": len(rows), **{name: right[name] / max(total, 1) for name in RECALL_VIEWS}}


# -- the curve ---------------------------------------------------------------------------------------------------------
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
    from .protocol import changed_settings

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
    from .tasks.base import read_json_rows

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
    from .protocol import with_overrides

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
    from .tasks.base import write_json_rows

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
        make_regime_study(folder, p).run(until="probe")
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


# -- the seed study and its reading --------------------------------------------------------------------------------------
SHARED_STAGES = ("data", "pretrained", "score")
"""Stages a seed does not change (their fingerprints exclude the seed): made once, copied into every seed's folder."""
REUSABLE_STAGES = (*SHARED_STAGES, "base", "probe")
"""What another study may lend a seed (``run_seeds``'s ``reuse``): every stage before the variants."""


def check_shared(source: Path, protocol: RegimeProtocol) -> None:
    """Refuse, in one line, shared stages in ``source`` made under other settings than ``protocol``'s: the study would
    otherwise rebuild them with its own, and no longer run on the curve's data, pretrained model and scores."""
    for stage in SHARED_STAGES:
        path = source / stage / "unit.json"
        if path.is_file() and unit_record(source, stage)["protocol"] != protocol.fingerprint(stage):
            raise ValueError(f"its {stage} stage ({path}) was made under other settings than this study's: give the "
                             "study the settings the curve ran with (--set)")


def copy_stage(source: Path, target: Path) -> None:
    """Copy a stage's folder whole or not at all (into a sibling, then renamed into place): a copy cut short never
    leaves a key file without what it keys, which would count as finished."""
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def take_stages(source: Path, folder: Path, protocol: RegimeProtocol) -> str:
    """Copy into ``folder`` each of :data:`REUSABLE_STAGES` that ``source`` (another study's seed folder) finished
    under ``protocol``'s settings for it and ``folder`` has not; says what it took, what was there already and what
    it left for being made under other settings."""
    from .study import KEY_FILE, Units

    units, taken, here, other = Units(protocol, device="cpu"), [], [], []
    for stage in REUSABLE_STAGES:
        if units.finished(folder / stage, stage, stage):
            here.append(stage)
        elif units.finished(source / stage, stage, stage):
            copy_stage(source / stage, folder / stage)
            taken.append(stage)
        elif (source / stage / KEY_FILE).is_file():
            other.append(stage)
    return (f"took {', '.join(taken) or 'no stage'}" + (f"; had {', '.join(here)} already" if here else "")
            + (f"; not {', '.join(other)} (made under other settings)" if other else ""))


def run_seeds(output: Path, protocol: RegimeProtocol, seeds: Sequence[int], deadline: float = math.inf,
              shared_from: Path | None = None, reuse: Path | None = None) -> bool:
    """The study in ``output/seed-<s>`` for each seed, each with its own base; the shared stages are copied from
    ``shared_from`` (e.g. the curve's folder of the chosen pretrained model) into the first seed's folder, and from
    there into the others', wherever finished (a unit checks its key, so a copy made under other settings is
    rebuilt). ``reuse``, another study's folder, lends each seed its finished stages up to the base and its probe
    (:data:`REUSABLE_STAGES`) wherever they were made under this protocol's settings for them: a study that changes
    only what the variants read (e.g. the trajectory ratio) trains no base again. False when the deadline stopped it
    (rerun to continue)."""
    from .study import KEY_FILE

    first = output / f"seed-{seeds[0]}"
    for seed in seeds:
        folder, p = output / f"seed-{seed}", dataclasses.replace(protocol, seed=seed)
        check_protocol(folder, p)
        folder.mkdir(parents=True, exist_ok=True)
        record_protocol(folder, p)
        if reuse is not None:
            print(f"seed {seed}: from {reuse}, {take_stages(reuse / f'seed-{seed}', folder, p)}", flush=True)
        source = first if folder != first else shared_from
        for stage in SHARED_STAGES if source is not None else ():
            if not (folder / stage).exists() and (source / stage / KEY_FILE).is_file():
                copy_stage(source / stage, folder / stage)
        if not make_regime_study(folder, p, deadline).run():
            return False
    return True


def seed_results(output: Path, protocol: RegimeProtocol, seeds: Sequence[int]) -> list[tuple[int, Any]]:
    """(seed, result) of every finished evaluation of every seed's study; the per-seed base is tagged with its seed."""
    from .study import load_result, models_plan

    results = []
    for seed in seeds:
        p = dataclasses.replace(protocol, seed=seed)
        study = make_regime_study(output / f"seed-{seed}", p)
        for unit in models_plan(p):
            if unit.threshold is not None and study.finished(unit):
                results.append((seed, load_result(study.unit_folder(unit) / "result.json")))
    return results


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval of a proportion (stays inside [0, 1] near 0 and 1, unlike the normal one)."""
    if n == 0:
        return (math.nan, math.nan)
    phat, denominator = correct / n, 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denominator
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denominator
    return centre - half, centre + half


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
    by_key = {(result.model, result.decoding["threshold"], seed): result for seed, result in results}
    pairs = sorted({(model, tau) for model, tau, _ in by_key if model != baseline and VARIANTS.get(model, (False,))[0]},
                   key=lambda pair: (pair[1], list(VARIANTS).index(pair[0])))
    rows = []
    for model, tau in pairs:
        seeds = sorted(s for m, t, s in by_key if (m, t) == (model, tau) and (baseline, tau, s) in by_key)
        ratios = {s: by_key[model, tau, s].tokens_per_step / by_key[baseline, tau, s].tokens_per_step for s in seeds}
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
"""Student's t 97.5% quantiles by degrees of freedom (any statistics table): a 95% interval over a few seeds; past
10 degrees of freedom the normal 1.96 is within 14% and is used."""


def seed_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean of per-seed values and its 95% t-interval over the seeds: (mean, low, high); NaN ends for one seed."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def frontier_rows(results: Sequence[tuple[int, Any]], baseline: str = "MDLM") -> list[dict[str, Any]]:
    """The frontier reading per TRIMS variant (docs/regime.md, studies 10-12): per seed the AUP of the variant's and of
    MDLM's (tokens per step, accuracy) points, both against the better of the two's best accuracy in that seed; the
    difference's mean over seeds with its 95% t-interval (``above`` / ``below`` when it excludes 0); and, per
    threshold, the MDLM thresholds whose point (tokens per step mean over seeds, accuracy pooled) dominates the
    variant's: at least its tokens per step and accuracy, one of them strictly."""
    from .aup import accuracy_under_parallelism

    points: dict[tuple[str, int], list[tuple[float, float]]] = {}
    pooled: dict[tuple[str, float], list[Any]] = {}
    for seed, result in results:
        points.setdefault((result.model, seed), []).append((result.tokens_per_step, 100 * result.accuracy))
        pooled.setdefault((result.model, result.decoding["threshold"]), []).append(result)

    def point(model: str, tau: float) -> tuple[float, float]:
        runs = pooled[model, tau]
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
            speed, accuracy = point(model, tau)
            dominated[tau] = [t for m, t in sorted(pooled) if m == baseline
                              and (other := point(baseline, t))[0] >= speed and other[1] >= accuracy
                              and other != (speed, accuracy)]
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
    seeds), AUP per seed over the model's thresholds (mean), the seeds."""
    from .aup import accuracy_under_parallelism

    groups: dict[tuple[str, float], list[tuple[int, Any]]] = {}
    for seed, result in results:
        groups.setdefault((result.model, result.decoding["threshold"]), []).append((seed, result))
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
    from .study import models_plan

    results = seed_results(output, protocol, seeds)
    planned = sum(unit.threshold is not None for unit in models_plan(protocol)) * len(seeds)
    claims, accuracy, frontier = claim_rows(results), accuracy_rows(results), frontier_rows(results)
    probes, spearman = {}, {}
    for seed in seeds:
        folder = output / f"seed-{seed}"
        if (folder / "probe" / "unit.json").is_file():
            probes[seed] = unit_record(folder, "probe")["levels"]
        for trace in sorted(folder.glob("eval/*/tau*/trace.json")):
            name = next(m for m in [BASE, *VARIANTS] if trace.parent.parent.name in ("base", f"{slug_of(m)}-seed{seed}"))
            spearman.setdefault(name, {})[seed] = json.loads(trace.read_text())["nll_vs_decode_step_spearman"]
    report = output / "report"
    report.mkdir(parents=True, exist_ok=True)
    head = (f"PARTIAL: {len(results)} of {planned} evaluations finished.\n\n" if len(results) < planned else "")
    level = protocol.test_level
    probe_lines = "\n".join(f"- seed {seed}: " + ", ".join(f"level {lv} {100 * v['accuracy']:.1f}% "
                                                           f"({v['answer_tokens']:.1f} tokens/answer)"
                                                           for lv, v in levels.items())
                            for seed, levels in probes.items())
    order = "\n".join(f"- {name}: " + ", ".join(f"seed {s} {'-' if v is None else f'{v:+.2f}'}" for s, v in by_seed.items())
                      for name, by_seed in spearman.items())
    text = (f"{head}Seeds {list(seeds)}, one base per seed; level {level}, {protocol.test_problems} test problems per "
            f"cell and seed.\n\nBase alone on the selection problems (tau {protocol.selection_threshold}):\n\n"
            f"{probe_lines}\n\nAccuracy (pooled over seeds, Wilson 95% interval), tokens per step (mean over seeds), "
            f"AUP:\n\n{format_accuracy(accuracy)}\n\nThe pre-registered reading (\"TRIMS raises tokens per step at "
            f"equal accuracy\" holds at a threshold when the ratio to MDLM is above 1 in at least 4 of 5 seeds and the "
            f"accuracy difference's 95% interval includes 0 or favours TRIMS):\n\n{format_claim(claims)}\n\n"
            f"The frontier (AUP of the variant minus MDLM's per seed, both against the pair's best accuracy; 95% "
            f"t-interval over seeds; MDLM points at least as fast and as accurate):\n\n{format_frontier(frontier)}\n\n"
            f"Spearman(teacher NLL of an answer token, steps into its block before it was committed) at tau "
            f"{protocol.trace_threshold()}, mean over {protocol.trace_samples} problems (negative: hard tokens first):"
            f"\n\n{order}\n")
    write_atomic(report / "study.md", text)
    write_atomic(report / "study.json", json.dumps({"protocol": dataclasses.asdict(protocol), "seeds": list(seeds),
                                                    "evaluations": len(results), "planned": planned,
                                                    "accuracy": accuracy, "claim": claims, "frontier": frontier,
                                                    "probes": probes,
                                                    "spearman": spearman}, indent=1, default=str))
    return report / "study.md"


# -- the mechanism: what the trajectory rows taught (trims_hf.mechanism) ------------------------------------------------
MECHANISM_ROWS = 200
"""Held-out test problems (the first of the test level's) the mechanism reads every model on: one forward of K reads a
problem and model."""


def seed_mechanism(folder: Path, protocol: RegimeProtocol, rows: int = MECHANISM_ROWS) -> dict[str, Any]:
    """The mechanism's readings of one seed's study (``folder/mechanism``, a unit kept under the protocol's
    fingerprint): the first ``rows`` test problems scored by the study's teacher, cut into K equal-mass buckets in each
    TRIMS variant's ordering, and :func:`trims_hf.mechanism.measure_future_gain` of the variant and of MDLM in that
    ordering (``gain``: ``{ordering: {model: FutureGain.as_dict()}}``); and every model's
    :func:`trims_hf.mechanism.decode_commit_profile` on the first ``trace_samples`` of them at the trace threshold, in
    hard-to-easy buckets cut over the ``rows`` problems (``commits``: ``{model: profile}``)."""
    from datasets import Dataset, load_dataset

    from .buckets import bucket_rows
    from .mechanism import decode_commit_profile, measure_future_gain
    from .schema import as_prompt_completion
    from .study import prepared_rows, score_rows, slug
    from .tasks.arith import ArithTask
    from .tasks.base import read_json_rows

    study, target = make_regime_study(folder, protocol), folder / "mechanism"
    if study.units.finished(target, "mechanism") and unit_record(folder, "mechanism")["requested_rows"] == rows:
        return {key: unit_record(folder, "mechanism")[key] for key in ("gain", "commits")}
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
    _, thresholds = bucket_rows(hard_first["student_score"], protocol.bucket_config("hard_to_easy"))
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


def slug_of(name: str) -> str:
    from .study import slug

    return slug(name)
