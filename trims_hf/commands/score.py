"""``trims score``: teacher-score a prompt/completion data set and write (and push) the scored dataset.

The teacher, scoring, bucket and output flags are shared with dataset scripts (``build_s1k_trims.py``)
through :data:`SCORING_TYPES` and :func:`score`, which also turns every user mistake into one ``error:``
line in the user's terms (flags, columns, paths) before the teacher's weights load, and Ctrl-C into a line
saying what was kept.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data.schema import COMPLETION, PROMPT, as_prompt_completion
from ..settings import DEFAULT_TEACHER, BucketConfig, ScoringOptions, check_masking_read
from . import INTERRUPTED, CommandParser, check_push_flags, fail


@dataclass
class SourceArguments:
    """Which rows to score."""

    dataset: str = field(metadata={"help": "Hub dataset id, or a local .jsonl/.json/.parquet file or dataset folder."})
    split: str = field(default="train", metadata={"help": "Split of a Hub dataset or dataset folder."})
    prompt_column: str = field(default=PROMPT, metadata={"help": "Column holding the prompt (text or chat messages)."})
    completion_column: str = field(default=COMPLETION, metadata={"help": "Column holding the completion text."})

    def __post_init__(self) -> None:
        if self.prompt_column == self.completion_column:
            raise ValueError(f"--prompt-column and --completion-column both name '{self.prompt_column}': the prompt and "
                             "the completion are two columns.")


@dataclass
class RowLimit:
    """How many rows to score."""

    limit: int | None = field(default=None, metadata={"help": "Score only the first N rows."})

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit={self.limit}: must be at least 1.")


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
    overwrite: bool = field(default=False, metadata={"help": "Replace an existing output folder: all it holds is deleted "
                                                              "first (trims export --overwrite keeps other files)."})
    push_to_hub: str | None = field(default=None, metadata={"help": "Dataset repo to push to (write access is checked first)."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face token (default: the saved login)."})
    private: bool = field(default=False, metadata={"help": "Create the Hub repo as private."})
    license: str | None = field(default=None, metadata={"help": "Licence of the scored data (usually the source data's)."})


SCORING_TYPES = (RowLimit, TeacherArguments, ScoringOptions, BucketConfig, OutputArguments)


def column_terms(prompt: str, completion: str) -> dict[str, str]:
    """How messages name the schema's prompt and completion fields: by the columns and flags the user gave."""
    return {PROMPT: f"column '{prompt}' (--prompt-column)", COMPLETION: f"column '{completion}' (--completion-column)"}


def in_user_terms(message: str, parser: CommandParser, fields: Mapping[str, str]) -> str:
    """A library message (schema fields, Python argument names) in the terms of the command line."""
    for name, term in fields.items():
        message = message.replace(f"field '{name}'", term)
    return parser.in_flag_terms(message)


def _job_messages() -> logging.Handler:
    """Show the job's progress notes (``resuming: ...``) on stderr as plain lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    job = logging.getLogger("trims_hf.data.score_job")
    job.addHandler(handler)
    job.setLevel(logging.INFO)
    return handler


@dataclass
class DataSource:
    """The data set the rows come from, as the command names it."""

    flag: str
    value: str
    default: str | None = None
    """The flag's default, when the user did not type the flag: messages then say the value was not chosen."""


def score(load: Callable[[], Any], teacher: TeacherArguments, options: ScoringOptions, buckets: BucketConfig,
          out: OutputArguments, data: DataSource, parser: CommandParser, fields: Mapping[str, str],
          given: Collection[str] = (), extra_metadata: dict[str, Any] | None = None) -> int:
    """Check the teacher, the data source and the output folder (in a second, before the heavy imports), then
    score the rows ``load()`` returns (after the Hub access check).

    User mistakes exit with code 2 and one line in the user's terms (``fields`` names the schema fields as the
    user knows them), and call a value "the default" only when its flag is not among ``given`` (the settings the
    command line set, :meth:`CommandParser.given`); Ctrl-C exits with 130 and says what was kept.
    """
    from ..errors import InputError, check_apart, check_output_path
    from ..sources import check_dataset_source, check_model_source

    try:
        check_masking_read(buckets)  # a ValueError in the settings' terms, said in the flags'
        check_push_flags(out.push_to_hub, token=out.token, private=out.private)
        check_model_source("--teacher", teacher.teacher, teacher.revision, teacher.gguf_file,
                           default=None if "teacher" in given else DEFAULT_TEACHER)
        check_dataset_source(data.flag, data.value, default=data.default)
        check_apart(out.output, f"--output {out.output}", data.value, f"{data.flag} {data.value}")
        check_apart(out.output, f"--output {out.output}", teacher.teacher, f"--teacher {teacher.teacher}", "the model",
                    inside=True)
        if Path(out.output).expanduser().resolve() in (Path.cwd(), *Path.cwd().parents):
            raise InputError(f"--output {out.output}: holds the current folder, and the scored data replaces its "
                             "folder whole; name a new folder.")
        check_output_path(out.output, f"--output {out.output}", existing="reuse" if out.overwrite else "refuse",
                          advice=" or pass --overwrite")
    except ValueError as error:  # InputError among them
        return fail(in_user_terms(str(error), parser, fields))
    from ..data.hub import HubAccessError
    from ..data.schema import SchemaError
    from ..data.score_job import ScoringInterrupted, build_scored_dataset, work_dir_for
    from ..distributed import announce, process_state

    state = process_state()
    announce(parser.prog, state)
    handler = _job_messages()
    try:
        folder = build_scored_dataset(
            load, out.output, teacher.teacher, gguf_file=teacher.gguf_file, revision=teacher.revision, options=options,
            buckets=buckets, source=data.value, license=out.license, push_to_hub=out.push_to_hub, token=out.token,
            private=out.private or None, overwrite=out.overwrite, extra_metadata=extra_metadata,
        )
    except (SchemaError, InputError, HubAccessError) as error:
        return fail(in_user_terms(str(error), parser, fields))
    except ScoringInterrupted as stop:
        if state.is_main_process:  # one line for all processes: the count is of the chunks they all saved
            print(f"interrupted: {stop}", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        if state.is_main_process:
            print(f"interrupted: nothing was written to {out.output}; scoring work saved so far (if any) stays in "
                  f"{work_dir_for(out.output)}; rerun the same command to resume.", file=sys.stderr)
        return INTERRUPTED
    finally:
        logging.getLogger("trims_hf.data.score_job").removeHandler(handler)
    if folder is not None:
        print(f"Scored dataset written to {folder}" + (f" and pushed to {out.push_to_hub}" if out.push_to_hub else ""))
    return 0


def main(argv: list[str]) -> int:
    parser = CommandParser((SourceArguments, *SCORING_TYPES), prog="trims score",
                           description="Score completions with an autoregressive teacher (NLL, entropy, buckets).")
    source, limit, teacher, options, buckets, out = parser.parse(argv)

    def load() -> Any:
        from ..data.hub import load_source_dataset

        rows = load_source_dataset(source.dataset, source.split, limit.limit, flag="--dataset")
        return as_prompt_completion(rows, source.prompt_column, source.completion_column,
                                    names=("--prompt-column", "--completion-column"))

    return score(load, teacher, options, buckets, out, DataSource("--dataset", source.dataset), parser,
                 column_terms(source.prompt_column, source.completion_column), given=parser.given(argv))
