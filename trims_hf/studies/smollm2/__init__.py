"""TRIMS on a pretrained student: the pre-registered SmolLM2-135M-Instruct replication (recipes/smollm2/README.md).

The protocol is fixed before any SFT variant runs and sized so that one GPU window (15 minutes, at most 10 per
command) produces the main comparison; its fingerprint is recorded with every output, and a study folder started
under one protocol refuses another. The stages are the library's study runner's, each resumable; this study adds:

  data        generated word problems at difficulty levels 1..L: train (all levels), selection and test per level
  pretrained  SmolLM2 converted once from its GGUF into a plain checkpoint (every later load is fast); the teacher
              is that model as it is (the paper's teacher is not fine-tuned either)
  select      the base alone decides the evaluated level (the pre-registered rule of :func:`select_level`)
  models      MDLM, TRIMS hard-to-easy and random at the main thresholds first (the main comparison); then the tail,
              which a call out of time drops from its end and names: TRIMS easy-to-hard, then every model at the
              further thresholds

* :mod:`.protocol`: :class:`Protocol` (window 1's), :class:`Protocol2` (the chain task, a 60% target, a longer annealed
  base), their full and smoke presets (:data:`PRESETS`) and :func:`select_level`;
* :mod:`.budgets`: the stage budgets on an H100, estimated from counts and from window 1's measured unit times;
* :mod:`.study`: :class:`~.study.Replication`, the study in a folder; the smoke size runs its stages on a CPU in
  seconds with a tiny Llama (pretrained for a second) and a tokenizer built from the data standing in for SmolLM2;
* :mod:`.prestudy`: the pretrained model's zero-shot autoregressive accuracy per level, before any GPU time;
* :mod:`.reading`: finished windows read side by side from their committed reports, each window apart.

Importing the package loads no torch: :mod:`.budgets`, :mod:`.study`, :mod:`.prestudy` and :mod:`.reading` (which
do) are imported where they run.
"""

from .protocol import FULL, FULL2, PRESETS, SMOKE, SMOKE2, SMOKE_SIZES, STAGES, Protocol, Protocol2, select_level

__all__ = ["FULL", "FULL2", "PRESETS", "SMOKE", "SMOKE2", "SMOKE_SIZES", "STAGES", "Protocol", "Protocol2",
           "select_level"]
