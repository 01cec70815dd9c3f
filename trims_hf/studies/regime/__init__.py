"""Where TRIMS can be judged: a student that gets the answers right, found on the MDLM base alone, then the seed study.

"More tokens per step at equal accuracy" says nothing when every model is at the floor (the demo's from-scratch
students solve 3-13% of their problems; SmolLM2's window 1 base solved 6%). So the regime is chosen first, on the MDLM
base alone and before any TRIMS variant, by a rule written down before the curve ran (docs/regime.md):

* :class:`~.protocol.RegimeProtocol` / :class:`~.study.RegimeStudy`: the library's study runner on the arithmetic chain problems
  (:func:`trims_hf.studies.arith.make_problem` with ``chain_steps``: long answers, mostly template, a few uncertain
  tokens) at several difficulty levels, with a tiny causal Llama trained here as the pretrained model and teacher;
  its ``probe`` stage measures the base on each level's held-out selection problems.
* :mod:`.curve`, :func:`run_curve`: the probe over a grid of knobs (student size, batch, base steps), cheapest first;
  :func:`choose` applies the pre-registered rule to its points.
* :mod:`.seeds`, :func:`run_seeds`: the study in the chosen regime, one base per seed (each seed its own folder, the data, the
  pretrained model and the teacher's scores shared), and :mod:`.reading`'s :func:`claim_rows`, the pre-registered reading;
* :mod:`.copies`: whether a base computes its results or copies them.

Importing the package loads no torch: :mod:`.study` (which does) is imported where a study runs.
"""

from .copies import RECALL_VIEWS, RESULT, result_masks, result_recall
from .curve import (
    CurveGrid,
    choose,
    chosen_protocol,
    format_curve,
    meets,
    plot_curve,
    point_name,
    pretrained_tag,
    read_curve,
    run_curve,
    size_folder,
)
from .mechanism import MECHANISM_ROWS, commit_rows, mechanism_rows, seed_mechanism, write_mechanism_report
from .protocol import RegimeProtocol
from .reading import (
    accuracy_rows,
    claim_rows,
    format_frontier,
    frontier_rows,
    paired_difference,
    seed_interval,
    wilson,
    write_seed_report,
)
from .seeds import REUSABLE_STAGES, SHARED_STAGES, check_shared, copy_stage, run_seeds

__all__ = ["MECHANISM_ROWS", "RECALL_VIEWS", "RESULT", "REUSABLE_STAGES", "SHARED_STAGES", "CurveGrid",
           "RegimeProtocol", "accuracy_rows", "check_shared", "choose", "chosen_protocol", "claim_rows",
           "commit_rows", "copy_stage", "format_curve", "format_frontier", "frontier_rows", "mechanism_rows",
           "meets", "paired_difference", "plot_curve", "point_name", "pretrained_tag", "read_curve", "result_masks",
           "result_recall", "run_curve", "run_seeds", "seed_interval", "seed_mechanism", "size_folder", "wilson",
           "write_mechanism_report", "write_seed_report"]
