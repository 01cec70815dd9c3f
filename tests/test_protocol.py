"""What each stage of a study depends on: a changed setting rebuilds exactly the stages that read it."""

from __future__ import annotations

import dataclasses

import pytest

from trims_hf.settings import BucketConfig, MaskingConfig
from trims_hf.studies.demo.presets import FAST
from trims_hf.studies.protocol import BASE, VARIANTS, fingerprint, with_overrides
from trims_hf.studies.regime import RegimeProtocol

OTHER_VALUE = {"num_buckets": "3", "bucket_ordering": "random", "metric": "entropy", "bucket_seed": "7",
               "quantile_tokens": "all", "p_context": "0.1", "p_future": "0.9", "trajectory_ratio": "0.5",
               "trajectory_selection": "fixed_subset", "trajectory_loss_weight": "none", "noise_schedule": "cosine",
               "min_t": "0.01", "train_on_padding": "false", "padding": "max_length", "pad_to_multiple_of": "8"}
"""A value other than every protocol's for each masking field."""

PROTOCOLS = {"regime": RegimeProtocol(), "demo": FAST}


def test_every_masking_field_has_another_value_to_try():
    assert set(OTHER_VALUE) == {f.name for f in dataclasses.fields(MaskingConfig)}


@pytest.mark.parametrize("kind", PROTOCOLS)
@pytest.mark.parametrize("name", OTHER_VALUE)
def test_the_teachers_buckets_depend_on_the_bucket_settings_and_the_base_on_all_but_the_trajectory_ratio(kind, name):
    protocol = PROTOCOLS[kind]
    changed = with_overrides(protocol, [f"masking.{name}={OTHER_VALUE[name]}"])
    assert getattr(changed.masking, name) != getattr(protocol.masking, name)
    same = {stage: changed.fingerprint(stage) == protocol.fingerprint(stage) for stage in ("data", "score", "base")}
    bucket_setting = name in {f.name for f in dataclasses.fields(BucketConfig)}
    assert same == {"data": True, "score": not bucket_setting, "base": name == "trajectory_ratio"}
    assert changed.fingerprint() != protocol.fingerprint()


@pytest.mark.parametrize("kind", PROTOCOLS)
def test_a_base_reused_at_another_trajectory_ratio_trains_exactly_as_it_would_have(kind, tmp_path):
    """Why the base's fingerprint may leave the ratio out: the base trains MDLM, at ratio 0, whatever the ratio."""
    protocol = PROTOCOLS[kind]
    changed = with_overrides(protocol, ["masking.trajectory_ratio=0.5"])
    args = [p.student_args(tmp_path, BASE, 0).to_dict() for p in (protocol, changed)]
    assert args[0] == args[1] and args[0]["trajectory_ratio"] == 0
    trims = [p.student_args(tmp_path, name, 0).to_dict()["trajectory_ratio"]
             for name, (trajectory, _) in VARIANTS.items() if trajectory for p in (protocol, changed)]
    assert trims == [protocol.masking.trajectory_ratio, 0.5] * 3


def test_a_dotted_field_fingerprints_that_setting_alone():
    protocol = RegimeProtocol()
    for name, value in (("masking.p_future", "0.9"), ("base_steps", "7")):
        changed = with_overrides(protocol, [f"{name}={value}"])
        assert (fingerprint(changed, ["masking.p_future"]) == fingerprint(protocol, ["masking.p_future"])) \
            == (name != "masking.p_future")
    assert fingerprint(protocol, ["masking"]) != fingerprint(with_overrides(protocol, ["masking.p_future=0.9"]), ["masking"])
