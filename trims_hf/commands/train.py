"""``trims train --config recipes/<model>/<recipe>.yaml [--key value ...]``: train a student from a recipe.

The recipe is read in :mod:`trims_hf.commands.recipe`, the job runs in :mod:`trims_hf.training.train_job`; this module only
reads the command line and reports errors.
Launch on several GPUs with ``accelerate launch --config_file recipes/accelerate/<setup>.yaml -m trims_hf.cli train ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import INTERRUPTED, fail

USAGE = """usage: trims train --config RECIPE.yaml [--key value ...]
       trims train --help-keys

Fine-tune a masked diffusion student with TRIMS (or the MDLM baseline) from a YAML recipe. Overrides follow
the recipe file and use the recipe's key names (dashes or underscores), e.g.
  trims train --config recipes/llada/trims_s1k.yaml --num_buckets 4 --output_dir out
A recipe key is any field of ModelArguments, DataArguments or MDLMConfig (every transformers
TrainingArguments field plus the TRIMS settings); `trims train --help-keys` lists them all with their help.
Inputs (recipe, values, student, data set, output_dir, Hub access) are checked before any model loads."""


def split_config(argv: list[str]) -> tuple[str | None, list[str]]:
    """``--config PATH`` (or ``--config=PATH``) from anywhere on the command line, and the overrides around it."""
    for index, arg in enumerate(argv):
        if arg == "--config":
            return (argv[index + 1] if index + 1 < len(argv) else None), argv[:index] + argv[index + 2 :]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1], argv[:index] + argv[index + 1 :]
    return None, argv


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv and argv[0] == "--help-keys":
        from .recipe import recipe_help

        print(recipe_help())
        return 0
    config, overrides = split_config(argv)
    if not config:
        return fail("trims train needs --config RECIPE.yaml (see `trims train --help`; recipes/ has examples).")
    if not Path(config).is_file():  # before the seconds of importing torch and transformers
        return fail(f"--config {config}: no such file.")
    from ..data.hub import HubAccessError
    from ..data.schema import SchemaError
    from ..errors import InputError
    from ..training.train_job import TrainingInterrupted, train
    from .recipe import parse_recipe

    try:
        train(*parse_recipe(config, overrides))
    except (InputError, HubAccessError, SchemaError) as error:
        return fail(str(error))
    except TrainingInterrupted as stop:
        print(stop, file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print("interrupted before training started; nothing was trained: rerun the same command.", file=sys.stderr)
        return INTERRUPTED
    return 0
