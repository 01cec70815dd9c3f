"""Evaluation, sweeps, the harness model and scoring on two gloo processes (one thread each) give a one-process run's
results; the balanced sharding they share; an interrupted two-process evaluation resumes to the same file; a
launch that asks for two processes and gets one says so."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA
from datasets import load_dataset
from helpers_launch import launch, two_processes
from helpers_teachers import save_teacher
from test_eval_cli import read, without_timings

from trims_hf.cli import main
from trims_hf.data.score_job import work_dir_for
from trims_hf.distributed import CPU_LAUNCH_ADVICE, balanced_shards
from trims_hf.evaluation.evaluate import gather_recorders, unit_costs
from trims_hf.generation import TokensPerStepRecorder

pytestmark = pytest.mark.slow  # two-process launches: minutes, so the inner loop (-m "not slow") skips them

TESTS = Path(__file__).resolve().parent
GSM8K_TEST = str(DATA / "gsm8k" / "test.jsonl")
EVAL = ["--task", "gsm8k", "--data-file", GSM8K_TEST, "--gen-length", "32", "--block-length", "16", "--limit", "5",
        "--batch-size", "2", "--no-progress"]
CLI = ["-m", "trims_hf.cli"]


# --- the sharding (pure) ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_shards", [1, 2, 3, 8])
def test_balanced_shards_cover_every_unit_once_within_the_largest_cost(num_shards):
    costs = [random.Random(seed).randint(20, 600) for seed in range(101)]
    shards = balanced_shards(costs, num_shards)
    assert len(shards) == num_shards and sorted(i for shard in shards for i in shard) == list(range(len(costs)))
    assert all(shard == sorted(shard) for shard in shards)
    loads = [sum(costs[i] for i in shard) for shard in shards]
    assert max(loads) - sum(loads) / num_shards <= max(costs)
    assert shards == balanced_shards(costs, num_shards)  # every process computes the same split


def test_balanced_shards_edge_cases():
    assert balanced_shards([5, 1], 4) == [[0], [1], [], []]
    assert balanced_shards([], 2) == [[], []]
    assert balanced_shards([3, 3, 3, 3], 2) == [[0, 2], [1, 3]]  # ties go to the lower shard, then alternate
    with pytest.raises(ValueError, match="at least 1"):
        balanced_shards([1], 0)


def test_unit_costs_are_padded_batch_tokens_per_setting():
    assert unit_costs([[10, 30], [5]], [64, 128]) == [2 * 94, 69, 2 * 158, 133]


def test_gathered_recorders_on_one_process_keep_the_counts():
    recorder = TokensPerStepRecorder()
    recorder.samples = {0: {"tokens": 7, "non_eos_tokens": 8, "nfe": 3}, 1: {"tokens": 2, "non_eos_tokens": 2, "nfe": 2}}
    recorder.model_forwards, recorder.wall_time_s, recorder.early_stop = 4, 1.5, True
    assert gather_recorders({"gsm8k": recorder})["gsm8k"].summary() == recorder.summary()


# --- trims eval ---------------------------------------------------------------------------------------------------

def one_and_two_processes(saved_student: str, folder: Path) -> tuple[Path, Path, str]:
    one, two = folder / "one" / "results.json", folder / "two" / "results.json"
    assert main(["eval", "--model", saved_student, *EVAL, "--output", str(one)]) == 0
    done = launch([*two_processes(), *CLI, "eval", "--model", saved_student, *EVAL, "--output", str(two)])
    return one, two, done.stderr


def same_results(one: Path, two: Path) -> None:
    ones, twos = read(one), read(two)
    assert [r["num_processes"] for r in ones] == [1] * len(ones) and [r["num_processes"] for r in twos] == [2] * len(ones)
    assert [without_timings(r) | {"num_processes": 0} for r in twos] == \
           [without_timings(r) | {"num_processes": 0} for r in ones]


@pytest.mark.parametrize("kind", ["llada_moe", "llada2"])
def test_two_process_eval_of_the_moe_students_writes_the_one_process_result(kind, tokenizer, tmp_path):
    """The newer students in their original layouts (LLaDA 2.x through its block-causal decoder) shard the same way."""
    from helpers_students import write_llada2_checkpoint, write_llada_moe_checkpoint

    write = write_llada2_checkpoint if kind == "llada2" else write_llada_moe_checkpoint
    one, two, err = one_and_two_processes(str(write(tmp_path / kind, tokenizer)), tmp_path)
    same_results(one, two)
    assert read(one)[0]["nfe"] > 0 and "running on 2 processes" in err


def test_an_interrupted_two_process_sweep_resumes_to_the_one_process_results(saved_student, tmp_path):
    """Each setting of a sweep shards the prompts over the processes; a sweep whose every process was interrupted
    resumes from their saved records, and every record equals the one-process run's."""
    one = tmp_path / "one.json"
    sweep = ["--sweep", "0.5,0.9"]
    assert main(["eval", "--model", saved_student, *EVAL, *sweep, "--output", str(one)]) == 0
    output = tmp_path / "two" / "results.json"
    arguments = ["eval", "--model", saved_student, *EVAL, *sweep, "--output", str(output)]
    stopped = launch([*two_processes(), str(TESTS / "interrupted_eval_script.py"), *arguments], check=False)
    assert stopped.returncode != 0 and not output.exists()
    saved = list(output.parent.glob("results.progress.rank-*.jsonl"))
    assert saved and sum(len(p.read_text().splitlines()) for p in saved) < 5
    done = launch([*two_processes(), *CLI, *arguments])
    assert "resuming:" in done.stderr and "trims eval: running on 2 processes (multi_cpu, gloo)" in done.stderr
    same_results(one, output)
    assert [r["decoding"]["threshold"] for r in read(output)] == [0.5, 0.9]
    assert [[s["prompt_id"] for s in r["samples"]] for r in read(output)] == [["0", "1", "2", "3", "4"]] * 2
    assert sorted(p.name for p in output.parent.iterdir()) == ["results.json", "results.png"]  # no progress files left


def test_a_launch_that_gets_one_process_says_so(saved_student, tmp_path):
    done = launch([sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2", "--num_machines",
                   "1", "--mixed_precision", "no", "--dynamo_backend", "no", *CLI, "eval", "--model", saved_student,
                   *EVAL, "--output", str(tmp_path / "results.json")])
    assert "trims eval: running on 1 process\n" in done.stderr
    assert f"warning: the launch asked for 2 processes and trims eval got 1; {CPU_LAUNCH_ADVICE}." in done.stderr


# --- trims score --------------------------------------------------------------------------------------------------

def test_two_process_score_scores_each_chunk_once_and_matches_one_process(tokenizer, gsm8k_rows, tmp_path):
    teacher = save_teacher(tokenizer, tmp_path / "teacher")
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in gsm8k_rows[:12]))
    arguments = ["score", "--teacher", str(teacher), "--dataset", str(data), "--min-work-chunks", "4"]
    launch([sys.executable, *CLI, *arguments, "--output", str(tmp_path / "one")])  # one thread, as each of the two
    done = launch([*two_processes(), *CLI, *arguments, "--output", str(tmp_path / "two")])
    assert "trims score: running on 2 processes (multi_cpu, gloo)" in done.stderr
    assert done.stderr.count("scoring [0]") and done.stderr.count("scoring [1]")  # both processes scored
    assert not work_dir_for(tmp_path / "two").exists()  # nothing left behind
    one, two = load_dataset(str(tmp_path / "one"), split="train"), load_dataset(str(tmp_path / "two"), split="train")
    for column in ("teacher_token_start", "teacher_token_end", "teacher_bucket"):
        assert two[column] == one[column], column
    np.testing.assert_array_equal(np.concatenate(two["teacher_nll"]), np.concatenate(one["teacher_nll"]))


# --- the harness model --------------------------------------------------------------------------------------------

def test_two_process_harness_matches_one_process(saved_student, tmp_path):
    model_dir = saved_student
    arguments = ["--model", "trims", "--model_args",
                 f"pretrained={model_dir},dtype=float32,strategy=threshold,gen_length=16,block_length=16",
                 "--tasks", "gsm8k_cot_local", "--limit", "5", "--batch_size", "1", "--device", "cpu",
                 "--metadata", json.dumps({"data_dir": str(DATA)}), "--log_samples"]
    outputs = {}
    for name, prefix in (("one", [sys.executable]), ("two", two_processes())):
        launch([*prefix, str(TESTS / "harness_script.py"), *arguments, "--output_path", str(tmp_path / name)])
        (results_file,) = (tmp_path / name).rglob("results_*.json")
        (trims_file,) = (tmp_path / name).rglob("trims_*.json")
        outputs[name] = json.loads(results_file.read_text()), json.loads(trims_file.read_text())
    (one, one_trims), (two, two_trims) = outputs["one"], outputs["two"]
    assert two["results"]["gsm8k_cot"] == one["results"]["gsm8k_cot"]
    timing = {"wall_time_s", "tokens_per_second"}
    counts = [{k: v for k, v in t["tokens_per_step"]["gsm8k_cot"].items() if k not in timing}
              for t in (one_trims, two_trims)]
    assert counts[0]["samples"] == 5 and counts[1] == counts[0]
    # lm-eval appends the answers to its padding copies to the padded request's resps: the answers graded are equal.
    answers = [sorted((s["doc_id"], s["filter"], s["filtered_resps"]) for s in load_samples(tmp_path / name))
               for name in ("one", "two")]
    assert answers[1] == answers[0]


def load_samples(folder: Path) -> list[dict]:
    (samples,) = folder.rglob("samples_gsm8k_cot_*.jsonl")
    return [json.loads(line) for line in samples.read_text().splitlines()]


# --- the multi-node configurations --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["multinode_ddp", "multinode_zero2"])
def test_multinode_configurations_are_2_nodes_of_8(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(TESTS.parent / "recipes" / "accelerate" / f"{name}.yaml"))
    assert (config.num_machines, config.num_processes, config.machine_rank) == (2, 16, 0)
    assert config.main_process_ip and config.main_process_port and not config.use_cpu
