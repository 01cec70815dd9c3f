"""No test leaves process-wide state behind (conftest's ``no_global_state_left``): the order-dependent failure where a
ZeRO-2 test, failing without DeepSpeed, left transformers' DeepSpeed config half-built and alive, and every later
``load_student`` raised ``'HfTrainerDeepSpeedConfig' object has no attribute 'is_zero3'``; and torch's CPU thread
count, which the study commands set for their process. The two tests run in file order: the first leaves the state
as those tests did, the second is any later test."""

from __future__ import annotations

import os

import torch
from conftest import FIXTURES
from transformers.integrations import deepspeed as hf_deepspeed

from trims_hf import load_student


class HalfBuiltConfig:
    """What ``HfTrainerDeepSpeedConfig.__init__`` had registered when ``dep_version_check("deepspeed")`` raised: the
    global weak reference is set first, and the failed test's traceback kept the object alive."""


LEFT_BEHIND: list[object] = []
THREADS = torch.get_num_threads()


def test_a_test_leaves_deepspeed_config_environment_threads_and_nothing_else_undoes_them():
    torch.set_num_threads(THREADS + 1)
    LEFT_BEHIND.append(HalfBuiltConfig())  # alive after the test, as the traceback kept it
    hf_deepspeed.set_hf_deepspeed_config(LEFT_BEHIND[0])
    os.environ["TRIMS_LEFT_BY_A_TEST"] = "1"
    assert hf_deepspeed._hf_deepspeed_config_weak_ref() is LEFT_BEHIND[0]


def test_a_later_test_loads_a_student_as_if_it_ran_alone():
    assert LEFT_BEHIND, "runs after the test above (file order)"
    assert not hf_deepspeed.is_deepspeed_zero3_enabled()  # AttributeError: no is_zero3, while the config is left
    assert "TRIMS_LEFT_BY_A_TEST" not in os.environ
    assert torch.get_num_threads() == THREADS
    model = load_student(str(FIXTURES / "llada_tiny"))
    assert model.config.mask_token_id == 255
