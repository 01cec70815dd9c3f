"""`trims --help` and every sub-command's `--help` against `python -c "import transformers"`: one JSON line.

Each help command runs as a fresh process, paired with an `import transformers` process run right
before it, so both see the same machine load; the ratio is taken pair by pair and its median
reported. Goal: every median ratio <= 1.5 (help imports only the chosen command's dataclasses).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from trims_hf.cli import COMMANDS

BASELINE = [sys.executable, "-c", "import transformers"]


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="Timed pairs per command (after one warm-up pair).")
    args = parser.parse_args()
    commands = {"trims": []} | {f"trims {name}": [name] for name in COMMANDS}
    baseline_times: list[float] = []
    result: dict[str, object] = {"bench": "cli_help", "runs": args.runs}
    for label, argv in commands.items():
        command = [sys.executable, "-m", "trims_hf.cli", *argv, "--help"]
        wall(BASELINE), wall(command)  # warm-up: file cache, byte-code
        pairs = [(wall(BASELINE), wall(command)) for _ in range(args.runs)]
        baseline_times += [b for b, _ in pairs]
        result[f"{label} --help seconds"] = round(statistics.median(c for _, c in pairs), 3)
        result[f"{label} --help ratio"] = round(statistics.median(c / b for b, c in pairs), 3)
    result["import transformers seconds"] = round(statistics.median(baseline_times), 3)
    result["max ratio"] = max(v for k, v in result.items() if k.endswith("ratio"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
