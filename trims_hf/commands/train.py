"""``trims train --config recipes/<model>/<recipe>.yaml [--key value ...]``: train a student from a recipe.

The recipe is read in :mod:`trims_hf.commands.recipe`, the job runs in :mod:`trims_hf.training.train_job`; this module only
reads the command line and reports errors.
Launch on several GPUs with ``accelerate launch --config_file recipes/accelerate/<setup>.yaml -m trims_hf.cli train ...``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from . import INTERRUPTED, CommandParser, fail, growable_cuda_segments

DESCRIPTION = (
    "Fine-tune a masked diffusion student with TRIMS (or the MDLM baseline) from a YAML recipe. Every other "
    "--key value pair overrides a recipe key (dashes or underscores), e.g. `trims train --config "
    "recipes/llada/trims_s1k.yaml --num_buckets 4 --output_dir out`. A recipe key is any field of ModelArguments, "
    "DataArguments or MDLMConfig (every transformers TrainingArguments field plus the TRIMS settings); --help-keys "
    "lists them with their help. Inputs (recipe, values, student, data set, output_dir, Hub access) are checked "
    "before any model loads."
)


@dataclass
class TrainArguments:
    """The recipe to train from; the rest of the command line overrides its keys."""

    config: str | None = field(default=None, metadata={
        "help": "The YAML recipe to train from (recipes/<student>/<recipe>.yaml); needed to train.",
        "metavar": "RECIPE.yaml"})
    help_keys: bool = field(default=False, metadata={"help": "List every recipe key with its help, and exit."})


def parser() -> CommandParser:
    return CommandParser((TrainArguments,), prog="trims train", description=DESCRIPTION)


def main(argv: list[str]) -> int:
    (args,), overrides = parser().parse_known(argv)
    if sum(arg == "--config" or arg.startswith("--config=") for arg in argv) > 1:  # argparse would keep the last
        return fail("trims train takes one --config RECIPE.yaml; the rest of the command line overrides its keys.")
    if args.help_keys:
        from .recipe import recipe_help

        print(recipe_help())
        return 0
    if not args.config:
        return fail("trims train needs --config RECIPE.yaml (see `trims train --help`; recipes/ has examples).")
    from ..errors import InputError, check_input_file

    try:  # before the seconds of importing torch and transformers
        check_input_file(args.config, f"--config {args.config}")
    except InputError as error:
        return fail(str(error))
    growable_cuda_segments()  # before CUDA starts (parsing the recipe may start it)
    from ..data.hub import HubAccessError
    from ..data.schema import SchemaError
    from ..training.train_job import TrainingInterrupted, check_overrides_read, train
    from .recipe import override_keys, parse_recipe

    try:
        model_args, data_args, training_args = parse_recipe(args.config, overrides)
        check_overrides_read(model_args, training_args, override_keys(overrides))
        train(model_args, data_args, training_args)
    except (InputError, HubAccessError, SchemaError) as error:
        return fail(str(error))
    except TrainingInterrupted as stop:
        print(stop, file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print("interrupted before training started; nothing was trained: rerun the same command.", file=sys.stderr)
        return INTERRUPTED
    return 0
