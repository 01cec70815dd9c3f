"""Build the TRIMS-scored s1K dataset (the paper's training set, teacher Qwen3-8B).

Formatting (the paper does not give one): prompt = the question; completion = the reasoning trace and
the final answer in Qwen3's thinking format, ``<think>\\n{trace}\\n</think>\\n\\n{answer}``, so the
teacher scores text shaped like its own outputs. Both are configurable and recorded in the card.

    python dataset_scripts/build_s1k_trims.py --output outputs/s1k-trims --push-to-hub USER/s1K-trims
    python dataset_scripts/build_s1k_trims.py --source simplescaling/s1K-1.1 --trace deepseek ...
    python dataset_scripts/build_s1k_trims.py --source my_s1k.parquet ...   (official s1K columns)
"""

from __future__ import annotations

import string
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from datasets import Dataset

from trims_hf.commands import CommandParser
from trims_hf.commands.score import SCORING_TYPES, DataSource, score
from trims_hf.data.hub import load_source_dataset
from trims_hf.data.schema import COMPLETION, PROMPT, SchemaError

DEFAULT_SOURCE = "simplescaling/s1K"
QUESTION = "question"
DEFAULT_TEMPLATE = "<think>\n{trace}\n</think>\n\n{answer}"
S1K_TRACE_COLUMNS = ("thinking_trajectories", "attempt")  # s1K: a one-element list of traces, and the answer
S1K_11_TRACE_COLUMNS = {name: (f"{name}_thinking_trajectory", f"{name}_attempt") for name in ("deepseek", "gemini")}


def trace_columns(column_names: list[str], trace: str, trace_given: bool = False) -> tuple[str, str]:
    """Which columns hold the trace and the answer: s1K's, or s1K-1.1's for the chosen ``trace`` (which s1K, with one
    trace, refuses when it was given)."""
    if QUESTION not in column_names:
        raise SchemaError(f"the --source rows have no '{QUESTION}' column; its columns are {', '.join(column_names)}.")
    if all(c in column_names for c in S1K_TRACE_COLUMNS):
        if trace_given:
            raise SchemaError(f"--trace {trace} picks one of s1K-1.1's two traces, and the --source rows are s1K's, with "
                              f"one ({', '.join(S1K_TRACE_COLUMNS)}); drop --trace.")
        return S1K_TRACE_COLUMNS
    if all(c in column_names for c in S1K_11_TRACE_COLUMNS[trace]):
        return S1K_11_TRACE_COLUMNS[trace]
    raise SchemaError(f"the --source rows have neither the columns {', '.join(S1K_TRACE_COLUMNS)} (s1K) nor "
                      f"{', '.join(S1K_11_TRACE_COLUMNS[trace])} (s1K-1.1 with --trace {trace}); its columns are "
                      f"{', '.join(column_names)}.")


def template_fields(template: str) -> set[str]:
    """The fields ``template`` fills: ``trace`` and/or ``answer``, nothing else (no attribute, index or conversion)."""
    try:
        named = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(template)
                 if name is not None]
    except ValueError as error:
        raise ValueError(f"completion_template {template!r} is not a format string ({error}).") from None
    if unknown := [name or "{}" for name, spec, conversion in named
                   if name not in ("trace", "answer") or spec or conversion]:
        raise ValueError(f"completion_template {template!r}: {unknown[0]!r} is not a field; use only {{trace}} and "
                         "{answer}.")
    if not named:
        raise ValueError(f"completion_template {template!r} holds neither {{trace}} nor {{answer}}: every row would "
                         "get the same completion.")
    return {name for name, _, _ in named}


def to_prompt_completion(row: dict[str, Any], index: int, trace_column: str, answer_column: str,
                         template: str) -> dict[str, str]:
    """One s1K row as prompt/completion; s1K stores its trace as a one-element list. A field the template fills must
    not be empty: the teacher would score the template's own text as the row."""
    trace = row[trace_column]
    trace = "\n".join(t for t in trace if t) if isinstance(trace, list) else trace
    values = {"trace": (trace or "").strip(), "answer": (row[answer_column] or "").strip()}
    columns = {"trace": trace_column, "answer": answer_column}
    if empty := [name for name in sorted(template_fields(template)) if not values[name]]:
        raise SchemaError(f"row {index}: column '{columns[empty[0]]}' (the {{{empty[0]}}} of --completion-template) is "
                          "empty; give rows with a trace and an answer.")
    return {PROMPT: row[QUESTION], COMPLETION: template.format(**values)}


def format_s1k(dataset: Dataset, trace: str = "deepseek", template: str = DEFAULT_TEMPLATE,
               trace_given: bool = False) -> tuple[Dataset, tuple[str, str]]:
    """Add ``prompt`` / ``completion`` columns to s1K rows (the source columns are kept); also returns the trace and
    answer columns read."""
    read = trace_columns(dataset.column_names, trace, trace_given)
    return dataset.map(to_prompt_completion, with_indices=True,
                       fn_kwargs={"trace_column": read[0], "answer_column": read[1], "template": template}), read


@dataclass
class S1KArguments:
    """Which s1K and how its rows become prompt/completion."""

    source: str = field(default=DEFAULT_SOURCE,
                        metadata={"help": "simplescaling/s1K, simplescaling/s1K-1.1, or a local parquet/jsonl."})
    trace: Literal["deepseek", "gemini"] = field(default="deepseek", metadata={"help": "Which s1K-1.1 trace to use."})
    completion_template: str = field(default=DEFAULT_TEMPLATE, metadata={"help": "Format string with {trace} and {answer}."})

    def __post_init__(self) -> None:
        template_fields(self.completion_template)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser((S1KArguments, *SCORING_TYPES), prog="build_s1k_trims.py", description=__doc__)
    parser.set_defaults(output="outputs/s1k-trims", license="mit")  # s1K's card declares MIT
    argv = sys.argv[1:] if argv is None else argv
    s1k, limit, teacher, options, buckets, out = parser.parse(argv)
    given = parser.given(argv)

    metadata = {"completion_template": s1k.completion_template}  # and, once the rows are read, the columns used

    def load() -> Dataset:
        rows = load_source_dataset(s1k.source, "train", limit.limit, flag="--source")
        formatted, (trace_column, answer_column) = format_s1k(rows, s1k.trace, s1k.completion_template,
                                                              "trace" in given)
        metadata.update(s1k_trace=s1k.trace if trace_column != S1K_TRACE_COLUMNS[0] else None,
                        s1k_trace_column=trace_column, s1k_answer_column=answer_column)
        return formatted

    fields = {PROMPT: f"column '{QUESTION}'", COMPLETION: "the completion built by --completion-template"}
    source = DataSource("--source", s1k.source, None if "source" in given else DEFAULT_SOURCE)
    return score(load, teacher, options, buckets, out, source, parser, fields, given=given, extra_metadata=metadata)


if __name__ == "__main__":
    sys.exit(main())
