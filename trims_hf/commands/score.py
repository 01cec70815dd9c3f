"""``trims score``: teacher-score a prompt/completion data set and write (and push) the scored dataset.

The teacher, scoring, bucket and output flags are shared with dataset scripts (``build_s1k_trims.py``)
through :data:`SCORING_TYPES` and :func:`score`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..schema import COMPLETION, PROMPT
from ..settings import DEFAULT_TEACHER, BucketConfig, ScoringOptions
from . import CommandParser, fail


@dataclass
class SourceArguments:
    """Which rows to score."""

    dataset: str = field(metadata={"help": "Hub dataset id, or a local .jsonl/.json/.parquet file."})
    split: str = field(default="train", metadata={"help": "Split of a Hub dataset."})
    prompt_column: str = field(default=PROMPT, metadata={"help": "Column holding the prompt (text or chat messages)."})
    completion_column: str = field(default=COMPLETION, metadata={"help": "Column holding the completion text."})
    limit: int | None = field(default=None, metadata={"help": "Score only the first N rows."})


@dataclass
class TeacherArguments:
    """The autoregressive teacher."""

    teacher: str = field(default=DEFAULT_TEACHER, metadata={"help": "Hub id, local folder, or .gguf file of a causal LM."})
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside --teacher (a Hub repo or folder)."})
    revision: str | None = field(default=None, metadata={"help": "Teacher revision on the Hub."})


@dataclass
class OutputArguments:
    """Where the scored dataset goes."""

    output: str = field(default="outputs/scored", metadata={"help": "Dataset folder to write."})
    overwrite: bool = field(default=False, metadata={"help": "Replace an existing output folder."})
    push_to_hub: str | None = field(default=None, metadata={"help": "Dataset repo to push to (write access is checked first)."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face token (default: the saved login)."})
    private: bool = field(default=False, metadata={"help": "Create the Hub repo as private."})
    license: str | None = field(default=None, metadata={"help": "Licence of the scored data (usually the source data's)."})


SCORING_TYPES = (TeacherArguments, ScoringOptions, BucketConfig, OutputArguments)


def score(load: Callable[[], Any], teacher: TeacherArguments, options: ScoringOptions, buckets: BucketConfig,
          out: OutputArguments, source: str, extra_metadata: dict[str, Any] | None = None) -> int:
    """Load the rows (``load()``), score them, report the result; user mistakes exit with code 2."""
    from ..hub import HubAccessError
    from ..schema import SchemaError
    from ..jobs.score import build_scored_dataset

    try:
        folder = build_scored_dataset(
            load(), out.output, teacher.teacher, gguf_file=teacher.gguf_file, revision=teacher.revision, options=options,
            buckets=buckets, source=source, license=out.license, push_to_hub=out.push_to_hub, token=out.token,
            private=out.private or None, overwrite=out.overwrite, extra_metadata=extra_metadata,
        )
    except (SchemaError, HubAccessError, FileExistsError) as error:
        return fail(str(error))
    if folder is not None:
        print(f"Scored dataset written to {folder}" + (f" and pushed to {out.push_to_hub}" if out.push_to_hub else ""))
    return 0


def as_prompt_completion(dataset: Any, prompt_column: str, completion_column: str) -> Any:
    """Rename the user's columns to the schema's ``prompt`` / ``completion``."""
    from ..schema import SchemaError

    for flag, column in (("--prompt-column", prompt_column), ("--completion-column", completion_column)):
        if column not in dataset.column_names:
            raise SchemaError(f"{flag} {column}: no such column (columns: {dataset.column_names}).")
    renames = {old: new for old, new in ((prompt_column, PROMPT), (completion_column, COMPLETION)) if old != new}
    return dataset.remove_columns([new for new in renames.values() if new in dataset.column_names]).rename_columns(renames)


def main(argv: list[str]) -> int:
    parser = CommandParser((SourceArguments, *SCORING_TYPES), prog="trims score",
                           description="Score completions with an autoregressive teacher (NLL, entropy, buckets).")
    source, teacher, options, buckets, out = parser.parse(argv)
    from ..hub import load_source_dataset

    return score(
        lambda: as_prompt_completion(load_source_dataset(source.dataset, source.split, source.limit),
                                     source.prompt_column, source.completion_column),
        teacher, options, buckets, out, source=source.dataset,
    )
