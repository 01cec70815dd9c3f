"""``trims train --config recipes/<model>/<recipe>.yaml [--key value ...]``: train a student from a recipe.

The logic lives in :mod:`trims_hf.jobs.train`; this module only reads the command line and reports errors.
Launch on several GPUs with ``accelerate launch --config_file recipes/accelerate/<setup>.yaml -m trims_hf.cli train ...``.
"""

from __future__ import annotations

from . import fail

USAGE = """usage: trims train --config RECIPE.yaml [--key value ...]
       trims train --help-keys

Fine-tune a masked diffusion student with TRIMS (or the MDLM baseline) from a YAML recipe. Overrides follow
the recipe file and use the recipe's key names (dashes or underscores), e.g.
  trims train --config recipes/llada/trims_s1k.yaml --num_buckets 4 --output_dir out
A recipe key is any field of ModelArguments, DataArguments or MDLMConfig (every transformers
TrainingArguments field plus the TRIMS settings); `trims train --help-keys` lists them all with their help."""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "--help-keys":
        from ..jobs.train import recipe_help

        print(recipe_help())
        return 0
    if argv[0] != "--config" or len(argv) < 2:
        return fail("trims train needs --config RECIPE.yaml first (see `trims train --help`)")
    from ..hub import HubAccessError
    from ..schema import SchemaError
    from ..jobs.train import RecipeError, parse_recipe, train

    try:
        train(*parse_recipe(argv[1], argv[2:]))
    except (RecipeError, HubAccessError, SchemaError) as error:
        return fail(str(error))
    return 0
