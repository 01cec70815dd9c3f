"""Cost of the code sandbox: every HumanEval canonical solution and every MBPP reference solution
graded under bubblewrap and under the plain-process fallback (the pre-bubblewrap layers).

Prints one JSON line: pass counts (all must pass) and wall milliseconds per program for each
isolation, and the bubblewrap overhead per program. Goal: all pass; overhead <= 100 ms.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from trims_hf.evaluation.tasks import HumanEvalTask, MBPPTask
from trims_hf.evaluation.tasks.base import CodeTask, Example
from trims_hf.evaluation.tasks.sandbox import Isolation, run_tests

MBPP_FILE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mbpp" / "mbpp.jsonl"


def reference_completions(mbpp_file: Path, limit: int | None) -> dict[str, tuple[CodeTask, list[tuple[Example, str]]]]:
    """Task name -> (task, [(example, completion holding its reference solution)])."""
    humaneval, mbpp = HumanEvalTask(), MBPPTask()
    mbpp_rows = [e for split in ("prompt", "test", "validation", "train") for e in mbpp.load(str(mbpp_file), split=split)]
    return {
        "humaneval": (humaneval, [(e, f"```python\n{e.fields['prompt']}{e.fields['canonical_solution']}\n```")
                                  for e in humaneval.load(limit=limit)]),
        "mbpp": (mbpp, [(e, e.fields["code"]) for e in mbpp_rows[:limit]]),
    }


def grade_all(task: CodeTask, items: list[tuple[Example, str]], isolation: Isolation) -> dict:
    start, failures = time.perf_counter(), []
    for example, completion in items:
        solution, tests = task.solution_and_tests(example, completion)
        result = run_tests(solution, tests, task.limits, isolation, task.entry_points(example))
        if not result.passed:
            failures.append(f"{example.id}: {result.reason}")
    elapsed = time.perf_counter() - start
    return {"passed": len(items) - len(failures), "ms_per_program": round(1000 * elapsed / len(items), 1),
            "failures": failures[:5]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mbpp-file", type=Path, default=MBPP_FILE)
    parser.add_argument("--limit", type=int, default=None, help="first N problems of each task (default: all)")
    args = parser.parse_args()
    report: dict = {}
    for name, (task, items) in reference_completions(args.mbpp_file, args.limit).items():
        runs = {isolation: grade_all(task, items, isolation) for isolation in ("process", "bubblewrap")}
        report[name] = {"problems": len(items), **runs,
                        "overhead_ms_per_program": round(runs["bubblewrap"]["ms_per_program"]
                                                         - runs["process"]["ms_per_program"], 1)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
