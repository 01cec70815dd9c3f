"""Build the TRIMS-scored s1K dataset (the paper's training set, teacher Qwen3-8B).

Formatting (the paper does not give one): prompt = the question; completion = the reasoning trace and
the final answer in Qwen3's thinking format, ``<think>\\n{trace}\\n</think>\\n\\n{answer}``, so the
teacher scores text shaped like its own outputs. Both are configurable and recorded in the card.

    python dataset_scripts/build_s1k_trims.py --output outputs/s1k-trims --push-to-hub USER/s1K-trims
    python dataset_scripts/build_s1k_trims.py --source simplescaling/s1K-1.1 --trace deepseek ...
    python dataset_scripts/build_s1k_trims.py --source my_s1k.parquet ...   (official s1K columns)
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from datasets import Dataset

from trims_hf.commands.score import add_scoring_arguments, score_from_args
from trims_hf.hub import load_source_dataset
from trims_hf.schema import COMPLETION, PROMPT, SchemaError

DEFAULT_TEMPLATE = "<think>\n{trace}\n</think>\n\n{answer}"
S1K_TRACE_COLUMNS = ("thinking_trajectories", "attempt")  # s1K: a one-element list of traces, and the answer
S1K_11_TRACE_COLUMNS = {name: (f"{name}_thinking_trajectory", f"{name}_attempt") for name in ("deepseek", "gemini")}


def trace_columns(column_names: list[str], trace: str) -> tuple[str, str]:
    """Which columns hold the trace and the answer: s1K's, or s1K-1.1's for the chosen ``trace``."""
    if all(c in column_names for c in S1K_TRACE_COLUMNS):
        return S1K_TRACE_COLUMNS
    if all(c in column_names for c in S1K_11_TRACE_COLUMNS[trace]):
        return S1K_11_TRACE_COLUMNS[trace]
    raise SchemaError(f"row 0: missing fields {S1K_TRACE_COLUMNS} (s1K) or {S1K_11_TRACE_COLUMNS[trace]} (s1K-1.1); "
                      f"columns are {column_names}.")


def to_prompt_completion(row: dict[str, Any], trace_column: str, answer_column: str, template: str) -> dict[str, str]:
    """One s1K row as prompt/completion; s1K stores its trace as a one-element list."""
    trace = row[trace_column]
    trace = "\n".join(trace) if isinstance(trace, list) else trace
    return {PROMPT: row["question"], COMPLETION: template.format(trace=(trace or "").strip(), answer=(row[answer_column] or "").strip())}


def format_s1k(dataset: Dataset, trace: str = "deepseek", template: str = DEFAULT_TEMPLATE) -> Dataset:
    """Add ``prompt`` / ``completion`` columns to s1K rows; the source columns are kept."""
    trace_column, answer_column = trace_columns(dataset.column_names, trace)
    return dataset.map(to_prompt_completion, fn_kwargs={"trace_column": trace_column, "answer_column": answer_column,
                                                        "template": template})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="simplescaling/s1K", help="simplescaling/s1K, simplescaling/s1K-1.1, or a local parquet/jsonl.")
    parser.add_argument("--trace", choices=sorted(S1K_11_TRACE_COLUMNS), default="deepseek", help="Which s1K-1.1 trace to use.")
    parser.add_argument("--completion-template", default=DEFAULT_TEMPLATE, help="Format string with {trace} and {answer}.")
    add_scoring_arguments(parser, default_output="outputs/s1k-trims", default_license="mit")  # s1K's card declares MIT
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return score_from_args(
        lambda: format_s1k(load_source_dataset(args.source, "train", args.limit), args.trace, args.completion_template),
        args, source=args.source, extra_metadata={"completion_template": args.completion_template, "s1k_trace": args.trace},
    )


if __name__ == "__main__":
    sys.exit(main())
