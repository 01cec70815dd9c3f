"""``trims score``: teacher-score a prompt/completion data set and write (and push) the scored dataset.

The teacher, scoring, bucket and output options are shared with dataset scripts (``build_s1k_trims.py``)
through :func:`add_scoring_arguments` and :func:`score_from_args`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from datasets import Dataset

from ..buckets import ORDERINGS
from ..hub import HubAccessError, load_source_dataset
from ..schema import COMPLETION, METRIC_COLUMNS, PROMPT, SchemaError
from ..scoring import DEFAULT_TEACHER, ScoringOptions, build_scored_dataset


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("score", help="Score completions with an autoregressive teacher (NLL, entropy, buckets).")
    parser.add_argument("--dataset", required=True, help="Hub dataset id, or a local .jsonl/.json/.parquet file.")
    parser.add_argument("--split", default="train")
    parser.add_argument("--prompt-column", default=PROMPT)
    parser.add_argument("--completion-column", default=COMPLETION)
    add_scoring_arguments(parser, default_output="outputs/scored")
    parser.set_defaults(func=run)


def add_scoring_arguments(parser: argparse.ArgumentParser, default_output: str, default_license: str | None = None) -> None:
    """Teacher, scoring, bucket, output and Hub options of any command that builds a scored dataset."""
    parser.add_argument("--teacher", default=DEFAULT_TEACHER, help="Hub id, local folder, or .gguf file of a causal LM.")
    parser.add_argument("--gguf-file", help="GGUF file name inside --teacher (a Hub repo or folder).")
    parser.add_argument("--revision", help="Teacher revision on the Hub.")
    parser.add_argument("--num-buckets", type=int, default=8)
    parser.add_argument("--metric", choices=sorted(METRIC_COLUMNS), default="nll")
    parser.add_argument("--ordering", choices=ORDERINGS, default="hard_to_easy")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the random ordering.")
    parser.add_argument("--prompt-format", default="chat_template",
                        help="'chat_template', 'plain', or a format string containing {prompt}.")
    parser.add_argument("--max-length", type=int, help="Teacher context (default: max_position_embeddings).")
    parser.add_argument("--truncate", action="store_true", help="Score the part of a too-long completion that fits (recorded in the card).")
    parser.add_argument("--max-tokens-per-batch", type=int, default=ScoringOptions.max_tokens_per_batch)
    parser.add_argument("--rows-per-work-chunk", type=int, default=ScoringOptions.rows_per_work_chunk)
    parser.add_argument("--output", default=default_output, help="Dataset folder to write.")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--push-to-hub", metavar="REPO", help="Dataset repo to push to (write access is checked first).")
    parser.add_argument("--token", help="Hugging Face token (default: the saved login).")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--license", default=default_license, help="Licence of the scored data (usually the source data's).")
    parser.add_argument("--limit", type=int, help="Score only the first N rows.")


def as_prompt_completion(dataset: Dataset, prompt_column: str, completion_column: str) -> Dataset:
    """Rename the user's columns to the schema's ``prompt`` / ``completion``."""
    for column in (prompt_column, completion_column):
        if column not in dataset.column_names:
            raise SchemaError(f"row 0: missing field '{column}' (columns: {dataset.column_names}).")
    renames = {old: new for old, new in ((prompt_column, PROMPT), (completion_column, COMPLETION)) if old != new}
    return dataset.remove_columns([new for new in renames.values() if new in dataset.column_names]).rename_columns(renames)


def score_from_args(load: Callable[[], Dataset], args: argparse.Namespace, source: str, extra_metadata: dict[str, Any] | None = None) -> int:
    """Load the data (``load()``), score it as ``args`` say, report the result; user errors exit with code 2."""
    options = ScoringOptions(prompt_format=args.prompt_format, max_length=args.max_length, truncate=args.truncate,
                             max_tokens_per_batch=args.max_tokens_per_batch, rows_per_work_chunk=args.rows_per_work_chunk)
    try:
        folder = build_scored_dataset(
            load(), args.output, args.teacher, gguf_file=args.gguf_file, revision=args.revision, options=options,
            num_buckets=args.num_buckets, metric=args.metric, ordering=args.ordering, seed=args.seed, source=source,
            license=args.license, push_to_hub=args.push_to_hub, token=args.token, private=args.private or None,
            overwrite=args.overwrite, extra_metadata=extra_metadata,
        )
    except (SchemaError, HubAccessError, FileExistsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if folder is not None:
        print(f"Scored dataset written to {folder}" + (f" and pushed to {args.push_to_hub}" if args.push_to_hub else ""))
    return 0


def run(args: argparse.Namespace) -> int:
    return score_from_args(
        lambda: as_prompt_completion(load_source_dataset(args.dataset, args.split, args.limit), args.prompt_column,
                                     args.completion_column),
        args, source=args.dataset,
    )
