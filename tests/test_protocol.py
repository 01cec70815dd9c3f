"""What each stage of a study depends on: a changed setting rebuilds exactly the stages that read it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
import torch
from conftest import synthetic_scored_rows
from datasets import Dataset

from trims_hf import TrimsDataCollator, prepare_dataset
from trims_hf.settings import BucketConfig, MaskingConfig, settings_record
from trims_hf.studies.demo.presets import FAST
from trims_hf.studies.protocol import BASE, TRAJECTORY_ONLY, VARIANTS, fingerprint, protocol_record, with_overrides
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
def test_the_teachers_buckets_depend_on_the_bucket_settings_and_the_base_on_what_a_ratio_0_model_reads(kind, name):
    protocol = PROTOCOLS[kind]
    changed = with_overrides(protocol, [f"masking.{name}={OTHER_VALUE[name]}"])
    assert getattr(changed.masking, name) != getattr(protocol.masking, name)
    same = {stage: changed.fingerprint(stage) == protocol.fingerprint(stage) for stage in ("data", "score", "base")}
    bucket_setting = name in {f.name for f in dataclasses.fields(BucketConfig)}
    assert same == {"data": True, "score": not bucket_setting, "base": name in ("trajectory_ratio", *TRAJECTORY_ONLY)}
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


@pytest.mark.parametrize("kind", PROTOCOLS)
@pytest.mark.parametrize("name", TRAJECTORY_ONLY)
def test_a_base_trains_with_the_trajectory_only_settings_at_their_defaults(kind, name, tmp_path):
    protocol = PROTOCOLS[kind]
    changed = with_overrides(protocol, [f"masking.{name}={OTHER_VALUE[name]}"])
    args = [p.student_args(tmp_path, BASE, 0).to_dict() for p in (protocol, changed)]
    assert args[0] == args[1]
    assert changed.student_args(tmp_path, "TRIMS hard-to-easy", 0).to_dict()[name] != args[0][name] \
        or name == "bucket_ordering"  # a variant's ordering is its own (VARIANTS)


@pytest.fixture(scope="module")
def prepared(gsm8k_rows, tokenizer):
    return list(prepare_dataset(Dataset.from_list(synthetic_scored_rows(gsm8k_rows[:12], tokenizer)), tokenizer))


def ratio_0_batches(tokenizer, prepared, **setting):
    masking = MaskingConfig(trajectory_ratio=0.0, **setting)
    collator = TrimsDataCollator(tokenizer, masking=masking, seed=5)
    batches = []
    for epoch in range(3):
        collator.epoch = epoch
        batches += [collator(prepared[start:start + 4]) for start in range(0, len(prepared), 4)]
    return batches


@pytest.mark.parametrize("name", [*TRAJECTORY_ONLY, "noise_schedule", "min_t"])
def test_at_ratio_0_the_trajectory_only_settings_change_no_batch(name, tokenizer, prepared):
    """Why the base's key may leave TRAJECTORY_ONLY out: at ratio 0 the collator draws the same masks, times and
    weights whatever they are, so the base would train the same even with them set (the schedule's settings, which
    the base does read, show that the comparison can fail)."""
    value = with_overrides(MaskingConfig(), [f"{name}={OTHER_VALUE[name]}"])
    reference = ratio_0_batches(tokenizer, prepared)
    changed = ratio_0_batches(tokenizer, prepared, **{name: getattr(value, name)})
    same = all(torch.equal(a[key], b[key]) for a, b in zip(reference, changed) for key in a if torch.is_tensor(a[key]))
    assert same == (name in TRAJECTORY_ONLY)
    assert not any(batch["is_trajectory"].any() for batch in reference + changed)


@dataclasses.dataclass
class _Inner:
    RECORDED_WHEN_SET: ClassVar[tuple[str, ...]] = ("later",)
    kept: int = 1
    later: bool = False


@dataclasses.dataclass
class _Outer:
    name: str = "x"
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    inners: tuple[_Inner, ...] = (_Inner(), _Inner(later=True))


def test_a_setting_added_later_is_recorded_only_once_set():
    assert settings_record(_Outer()) == {"name": "x", "inner": {"kept": 1},
                                         "inners": ({"kept": 1}, {"kept": 1, "later": True})}
    assert settings_record(_Outer(inner=_Inner(later=True)))["inner"] == {"kept": 1, "later": True}
    assert settings_record(_Outer(inner=_Inner(kept=2)))["inner"] == {"kept": 2}


@pytest.mark.parametrize("name", PROTOCOLS)
def test_compiled_decoder_blocks_are_a_changed_protocol_and_the_default_is_not(name):
    protocol = PROTOCOLS[name]
    assert "decoding.compile_blocks" not in protocol_record(protocol)
    compiled = with_overrides(protocol, ["decoding.compile_blocks=true"])
    assert protocol_record(compiled)["decoding.compile_blocks"] is True
    assert fingerprint(compiled) != fingerprint(protocol)


@pytest.mark.parametrize("window, seed", [("window-2", 0), ("window-3", 1), ("window-4", 2), ("window-5", 3), ("window-6", 4)])
def test_a_registered_study_keeps_its_fingerprint(window, seed):
    """Each SmolLM2 protocol-2 window's results record the fingerprint its seed's protocol had when it ran; the protocol
    as the library builds it today must still have it, or a rerun would not continue that study."""
    import json
    from pathlib import Path

    from trims_hf.studies.smollm2.protocol import FULL2

    results = Path(__file__).resolve().parents[1] / "docs" / "results" / "smollm2" / window / "results.json"
    recorded = json.loads(results.read_text())
    assert recorded["protocol"]["seed"] == seed
    assert fingerprint(dataclasses.replace(FULL2, seed=seed)) == recorded["protocol_fingerprint"]
