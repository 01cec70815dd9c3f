"""``trims train --config recipes/<model>/<recipe>.yaml [--key value ...]``: train a student from a recipe.

The logic lives in :mod:`trims_hf.training`; this module only parses the command line and reports errors.
Launch on several GPUs with ``accelerate launch --config_file recipes/accelerate/<setup>.yaml -m trims_hf.cli train ...``.
"""

from __future__ import annotations

import argparse
import sys

from ..hub import HubAccessError
from ..schema import SchemaError
from ..training import RecipeError, parse_recipe, recipe_help, train


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train", help="Fine-tune a masked diffusion student with TRIMS (or the MDLM baseline) from a YAML recipe.",
        description="Overrides follow the recipe file and use the recipe's key names, e.g. "
                    "`trims train --config recipes/llada/trims_s1k.yaml --num_buckets 4 --output_dir out`.",
    )
    parser.add_argument("--config", nargs=argparse.REMAINDER, metavar="RECIPE.yaml [--key value ...]",
                        help="Recipe file, then any overrides (every remaining argument).")
    parser.add_argument("--help-keys", action="store_true", help="List every recipe key with its help and exit.")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.help_keys:
        print(recipe_help())
        return 0
    if not args.config:
        print("error: trims train needs --config RECIPE.yaml", file=sys.stderr)
        return 2
    recipe, *overrides = args.config
    try:
        train(*parse_recipe(recipe, overrides))
    except (RecipeError, HubAccessError, SchemaError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
