"""How study 8's stages were lent to study 9 (a record of what ran, docs/regime.md "Study 9").

Study 8 ran before stage keys could name single settings (5904817), so its score, base and probe keys are computed
the old way. This script checks each key against what the code that made it computes and rewrites it to what the
new code computes for the same protocol; the stages themselves are copied unchanged.

    git worktree add /tmp/oldtree b2f0314
    PYTHONPATH=/tmp/oldtree python lend.py keys CURVE8 > old.json     # the code study 8 ran with
    PYTHONPATH=NEWCHECKOUT python lend.py keys CURVE8 > new.json      # a2b1265, as study 9 ran (later commits
                                                                       # moved these modules into trims_hf.studies)
    python lend.py lend STUDY8 old.json new.json OUT8LENT
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

STAGES = ("data", "pretrained", "score", "base", "probe")
SETTINGS = ["levels=0,1", "chain_steps=4"]  # what study 8 was given beside --from-curve


def keys(curve: Path) -> dict:
    """Per seed: the whole protocol's fingerprint and each stage's, for study 8's protocol and at ratio 0.5."""
    from trims_hf import regime
    from trims_hf.protocol import with_overrides

    chosen = regime.chosen_protocol(with_overrides(regime.RegimeProtocol(), SETTINGS),
                                    regime.read_curve(curve / "curve.jsonl"))
    protocol = with_overrides(chosen, SETTINGS)
    out = {}
    for seed in range(5):
        for name, p in (("study8", dataclasses.replace(protocol, seed=seed)),
                        ("ratio0.5", with_overrides(dataclasses.replace(protocol, seed=seed),
                                                    ["masking.trajectory_ratio=0.5"]))):
            out.setdefault(str(seed), {})[name] = {"full": p.fingerprint(), **{s: p.fingerprint(s) for s in STAGES}}
    return out


def lend(study8: Path, old: dict, new: dict, out: Path) -> None:
    for seed in map(str, range(5)):
        recorded = json.loads((study8 / f"seed-{seed}" / "protocol.json").read_text())["fingerprint"]
        assert recorded == old[seed]["study8"]["full"] == new[seed]["study8"]["full"], seed
        for stage in STAGES:
            key = json.loads((study8 / f"seed-{seed}" / stage / "cache-key.json").read_text())
            assert key == {"unit": stage, "protocol": old[seed]["study8"][stage], "format": 2}, (seed, stage, key)
            assert new[seed]["study8"][stage] == new[seed]["ratio0.5"][stage], (seed, stage)
            shutil.copytree(study8 / f"seed-{seed}" / stage, out / f"seed-{seed}" / stage)
            (out / f"seed-{seed}" / stage / "cache-key.json").write_text(
                json.dumps({**key, "protocol": new[seed]["study8"][stage]}, indent=2))
            print(seed, stage, old[seed]["study8"][stage], "->", new[seed]["study8"][stage])


if __name__ == "__main__":
    if sys.argv[1] == "keys":
        print(json.dumps(keys(Path(sys.argv[2])), indent=1))
    else:
        lend(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()), json.loads(Path(sys.argv[4]).read_text()),
             Path(sys.argv[5]))
