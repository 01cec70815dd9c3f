"""``trims eval`` whose every process is interrupted (Ctrl-C) at its second batch; run by tests/test_data_parallel.py.

Usage: ``accelerate launch ... tests/interrupted_eval_script.py eval --model ... --output ...`` (the ``trims``
command line).
"""

from __future__ import annotations

import sys

from trims_hf.cli import main
from trims_hf.evaluation import evaluate as evaluation

decode, calls = evaluation.generate_text, []


def interrupted_at_the_second_batch(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        raise KeyboardInterrupt
    return decode(*args, **kwargs)


if __name__ == "__main__":
    evaluation.generate_text = interrupted_at_the_second_batch
    sys.exit(main(sys.argv[1:]))
