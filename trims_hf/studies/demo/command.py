"""``trims demo``: the whole TRIMS chain offline on a CPU, from teacher scoring to the paper-shaped table and plots.

The study lives in :mod:`trims_hf.studies.demo.pipeline`, its protocol and presets in :mod:`trims_hf.studies.demo.presets`; this
module only parses the command line: a preset, changed field by field with ``--set`` (as every study command).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...commands import INTERRUPTED, CommandParser, fail
from ...determinism import DEFAULT_THREADS, run_pinned

DESCRIPTION = (
    "Trains a small causal Llama (the teacher) on generated arithmetic word problems, scores and buckets them, turns "
    "it into a bidirectional MDLM base, continues the base with MDLM and three TRIMS orderings, and reports accuracy "
    "and tokens per step at several thresholds (table, JSON, frontier, decode-order and teacher-NLL plots). The "
    "preset (default, --fast, --study) is changed field by field with --set; --fields lists the fields. Finished "
    "stages are kept in --output, so a rerun continues where it stopped."
)


@dataclass
class DemoArguments:
    """The demo's preset, inputs and field overrides."""

    output: str = field(default="./trims-demo", metadata={"help": "Output folder; it also keeps the finished stages."})
    fast: bool = field(default=False, metadata={"help": "The smoke preset: tiny sizes, every step runs, nothing is "
                                                        "learned well."})
    study: bool = field(default=False, metadata={"help": "The seed study: every variant over SFT seeds 0, 1, 2, "
                                                         "reported with mean and spread."})
    data_file: str | None = field(
        default=None, metadata={"help": "GSM8K-style JSONL (question, answer ending in '#### N') split into training "
                                "and test problems instead of the generated ones; 512-token training sequences and "
                                "256 generated tokens."})
    threads: int = field(
        default=DEFAULT_THREADS,
        metadata={"help": "CPU threads (at most the CPUs this process may use, or the default, which the docs' numbers "
                  "were made with, on fewer CPUs too, slower). Like the vector instruction set and MKL's and oneDNN's "
                  "code paths (pinned to AVX2 before torch loads), they decide the float results: the same count "
                  "reproduces them on the same CPU model."},
    )
    set: list[str] = field(
        default_factory=list,
        metadata={"help": "Change fields of the preset, e.g. seeds=0,1,2,3,4 variant_steps=600 teacher=smollm2 "
                  "masking.p_future=0.9 (tuples comma-separated; --fields lists every field).",
                  "action": "extend", "metavar": "FIELD=VALUE"},
    )
    fields: bool = field(default=False, metadata={"help": "Print every field with its value under the chosen preset "
                                                          "and what it means, then exit."})


def main(argv: list[str]) -> int:
    (args,) = CommandParser(DemoArguments, prog="trims demo", description=DESCRIPTION).parse(argv)
    from ..protocol import describe_fields
    from .presets import settings_for

    try:
        settings = settings_for(args.fast, args.study, args.data_file, args.threads, args.set)
    except ValueError as error:
        return fail(str(error))
    if args.fields:
        print(describe_fields(settings))
        return 0
    code = run_pinned("trims_hf.cli", ["demo", *argv])
    if code is not None:
        return code
    from ..units import StudyInterrupted
    from .pipeline import run_demo

    try:
        run_demo(args.output, settings)
    except (FileNotFoundError, NotADirectoryError, ValueError) as error:
        return fail(str(error))
    except StudyInterrupted as stop:
        return fail(f"interrupted {stop}", INTERRUPTED)
    return 0
