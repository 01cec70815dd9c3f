"""Distributed training on CPU (2 gloo processes): DDP, and DeepSpeed ZeRO-2 from the shipped launch configuration.

The processes are launched as :mod:`helpers_launch` explains; ``use_cpu=True`` in the training arguments then
gives a gloo process group on CPU.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import needs_deepspeed
from helpers_launch import free_port, launch, two_processes

from trims_hf.commands.recipe import parse_recipe

pytestmark = pytest.mark.slow  # multi-process training launches: minutes, so the inner loop (-m "not slow") skips them

TESTS = Path(__file__).resolve().parent
SCRIPT = TESTS / "ddp_train_script.py"
ACCELERATE = TESTS.parent / "recipes" / "accelerate"


def run(command: list[str], cwd: Path = TESTS) -> None:
    launch(command, cwd, timeout=120)


METRICS = ("loss", "mask_ratio", "trajectory_share", "loss_standard", "loss_trajectory")


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("single")
    run([sys.executable, str(SCRIPT), str(out), "8", "1"])
    return torch.load(out / "rank0.pt")


@pytest.mark.parametrize("per_device,accumulation", [(4, 1), (2, 2)])
def test_two_processes_match_one_with_the_same_global_batch(tmp_path, single_process, per_device, accumulation):
    """Rows of different lengths, not pre-padded: 1 x 8 == 2 processes x 4 == 2 processes x 2 x GA 2."""
    run([*two_processes(), str(SCRIPT), str(tmp_path), str(per_device), str(accumulation)])
    reference = single_process
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    assert reference["world_size"] == 1 and ranks[0]["world_size"] == 2 and len(reference["logs"]) == 3
    for expected, logged in zip(reference["logs"], ranks[0]["logs"], strict=True):
        for name in METRICS:
            assert (name in logged) == (name in expected), name
            if name in expected:
                assert logged[name] == pytest.approx(expected[name], rel=1e-5), name
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])  # DDP kept the replicas identical
    assert torch.allclose(ranks[0]["weights"], reference["weights"], atol=1e-5)
    # The statistics cross processes once per log, not at every micro-step.
    assert ranks[0]["reductions"] == ranks[1]["reductions"] == len(ranks[0]["logs"])
    assert reference["reductions"] == 0


# Set in zero2.json (filled from TrainingArguments); accelerate refuses them in the YAML as well.
JSON_OWNED = {"mixed_precision", "gradient_accumulation_steps", "gradient_clipping", "zero_stage",
              "offload_optimizer_device", "offload_param_device"}


@needs_deepspeed
def test_zero2_configuration():
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin, DistributedType
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    raw = yaml.safe_load((ACCELERATE / "zero2.yaml").read_text())
    assert not JSON_OWNED & (set(raw) | set(raw["deepspeed_config"]))
    config = load_config_from_file(str(ACCELERATE / "zero2.yaml"))
    assert config.distributed_type == DistributedType.DEEPSPEED and config.num_processes == 8
    json_file = TESTS.parent / config.deepspeed_config["deepspeed_config_file"]
    assert json_file.exists()
    assert DeepSpeedPlugin(hf_ds_config=str(json_file)).zero_stage == 2
    # The split the batch search makes of the recipe's global batch of 32 on 8 GPUs with one row each.
    _, _, args = parse_recipe(ACCELERATE.parent / "llada" / "trims_s1k.yaml", ["--use_cpu", "true"])
    args.per_device_train_batch_size, args.gradient_accumulation_steps = 1, 4  # as fit_global_batch sets them
    filled = HfTrainerDeepSpeedConfig(str(json_file))
    filled.trainer_config_process(args)  # what the Trainer does with the recipe's TrainingArguments
    filled.fill_only("zero_optimization.reduce_bucket_size", 4096 * 4096)  # from the model at finalize time
    assert "auto" not in json.dumps(filled.config)
    assert filled.config["bf16"]["enabled"] is True and filled.config["gradient_accumulation_steps"] == 4
    assert filled.config["train_micro_batch_size_per_gpu"] == 1 and filled.config["gradient_clipping"] == 1.0


@needs_deepspeed
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled_blocks"])
def test_zero2_steps_on_cpu_match_one_process(tmp_path, single_process, compiled):
    """The shipped zero2.yaml/zero2.json, launched as users do (only --num_processes 2), on DeepSpeed's CPU
    accelerator (gloo + its shared-memory allreduce): ZeRO-2 trains, and its steps equal one eager process's, with
    the decoder blocks compiled too (the recipes train so), to float rounding."""
    launch([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE / "zero2.yaml"),
            "--num_processes", "2", "--main_process_port", str(free_port()), str(SCRIPT), str(tmp_path), "4", "1",
            *(["compiled"] if compiled else [])],
           cwd=TESTS.parent, timeout=900 if compiled else 120)  # zero2.yaml names zero2.json from the repository root
    reference = single_process
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    assert reference["zero_stage"] is None and [r["zero_stage"] for r in ranks] == [2, 2]
    assert ranks[0]["world_size"] == 2 and [r["compiled_blocks"] for r in ranks] == [2 * compiled] * 2
    assert [r["compiled_graphs"] > 0 for r in ranks] == [compiled] * 2  # compiled code ran, not just a wrapper set
    losses = [log["loss"] for log in ranks[0]["logs"]]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    tolerance = 1e-4 if compiled else 1e-5
    assert losses == pytest.approx([log["loss"] for log in reference["logs"]], rel=tolerance)
    assert not torch.allclose(ranks[0]["weights"], ranks[0]["initial"], atol=1e-3)  # the steps moved the weights
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])
    assert torch.allclose(ranks[0]["weights"], reference["weights"], atol=10 * tolerance)
