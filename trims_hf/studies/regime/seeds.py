"""The seed study in the chosen regime: one folder and one base per seed, the data, the pretrained model and the
teacher's scores shared, and stages lent by another study wherever they were made under the same settings."""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..protocol import check_protocol, record_protocol
from .protocol import RegimeProtocol
from .records import unit_record

SHARED_STAGES = ("data", "pretrained", "score")
"""Stages a seed does not change (their fingerprints exclude the seed): made once, copied into every seed's folder."""
REUSABLE_STAGES = (*SHARED_STAGES, "base", "probe")
"""What another study may lend a seed (``run_seeds``'s ``reuse``): every stage before the variants."""


def check_shared(source: Path, protocol: RegimeProtocol) -> None:
    """Refuse, in one line, shared stages in ``source`` made under other settings than ``protocol``'s: the study would
    otherwise rebuild them with its own, and no longer run on the curve's data, pretrained model and scores."""
    for stage in SHARED_STAGES:
        path = source / stage / "unit.json"
        if path.is_file() and unit_record(source, stage)["protocol"] != protocol.fingerprint(stage):
            raise ValueError(f"its {stage} stage ({path}) was made under other settings than this study's: give the "
                             "study the settings the curve ran with (--set)")


def copy_stage(source: Path, target: Path) -> None:
    """Copy a stage's folder whole or not at all (into a sibling, then renamed into place): a copy cut short never
    leaves a key file without what it keys, which would count as finished."""
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def take_stages(source: Path, folder: Path, protocol: RegimeProtocol) -> str:
    """Copy into ``folder`` each of :data:`REUSABLE_STAGES` that ``source`` (another study's seed folder) finished
    under ``protocol``'s settings for it and ``folder`` has not; says what it took, what was there already and what
    it left for being made under other settings."""
    from ..units import KEY_FILE, Units

    units, taken, here, other = Units(protocol, device="cpu"), [], [], []
    for stage in REUSABLE_STAGES:
        if units.finished(folder / stage, stage, stage):
            here.append(stage)
        elif units.finished(source / stage, stage, stage):
            copy_stage(source / stage, folder / stage)
            taken.append(stage)
        elif (source / stage / KEY_FILE).is_file():
            other.append(stage)
    return (f"took {', '.join(taken) or 'no stage'}" + (f"; had {', '.join(here)} already" if here else "")
            + (f"; not {', '.join(other)} (made under other settings)" if other else ""))


def run_seeds(output: Path, protocol: RegimeProtocol, seeds: Sequence[int], deadline: float = math.inf,
              shared_from: Path | None = None, reuse: Path | None = None) -> bool:
    """The study in ``output/seed-<s>`` for each seed, each with its own base; the shared stages are copied from
    ``shared_from`` (e.g. the curve's folder of the chosen pretrained model) into the first seed's folder, and from
    there into the others', wherever finished (a unit checks its key, so a copy made under other settings is
    rebuilt). ``reuse``, another study's folder, lends each seed its finished stages up to the base and its probe
    (:data:`REUSABLE_STAGES`) wherever they were made under this protocol's settings for them: a study that changes
    only what the variants read (e.g. the trajectory ratio) trains no base again. False when the deadline stopped it
    (rerun to continue)."""
    from ..units import KEY_FILE, check_study_folder
    from .study import RegimeStudy

    first = output / f"seed-{seeds[0]}"
    for seed in seeds:  # every seed's folder, before any seed runs
        check_study_folder(output / f"seed-{seed}", f"--output {output} (seed {seed}: {output / f'seed-{seed}'})")
    for seed in seeds:
        folder, p = output / f"seed-{seed}", dataclasses.replace(protocol, seed=seed)
        check_protocol(folder, p)
        folder.mkdir(parents=True, exist_ok=True)
        record_protocol(folder, p)
        if reuse is not None:
            print(f"seed {seed}: from {reuse}, {take_stages(reuse / f'seed-{seed}', folder, p)}", flush=True)
        source = first if folder != first else shared_from
        for stage in SHARED_STAGES if source is not None else ():
            if not (folder / stage).exists() and (source / stage / KEY_FILE).is_file():
                copy_stage(source / stage, folder / stage)
        if not RegimeStudy(folder, p, deadline=deadline).run():
            return False
    return True


def seed_results(output: Path, protocol: RegimeProtocol, seeds: Sequence[int]) -> list[tuple[int, Any]]:
    """(seed, result) of every finished evaluation of every seed's study; the per-seed base is tagged with its seed."""
    from ..stages import load_result
    from ..study import models_plan
    from .study import RegimeStudy

    results = []
    for seed in seeds:
        p = dataclasses.replace(protocol, seed=seed)
        study = RegimeStudy(output / f"seed-{seed}", p)
        for unit in models_plan(p):
            if unit.threshold is not None and study.finished(unit):
                results.append((seed, load_result(study.unit_folder(unit) / "result.json")))
    return results
