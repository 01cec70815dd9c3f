"""AUP, Accuracy Under Parallelism: the one number d3LLM's dLLM leaderboard ranks decoders by.

Definition (Qian et al., "d3LLM: Ultra-Fast Diffusion LLM using Pseudo-Trajectory Distillation", arXiv:2601.07568;
the blog "AUP: when Accuracy Meets Parallelism in Diffusion Language Models", hao-ai-lab.github.io/blogs/text-diffusion,
section "AUP: Considering Both Performance and Parallelism"; reference code github.com/hao-ai-lab/d3LLM at commit
e5bfcac, ``AUP_leaderboard/aup_utils.py`` lines 5-63, ``weight_function`` and ``get_aup``): for parallelism-accuracy
pairs (rho_i, y_i) sorted by rho (tokens per forward) with y in percent, keep the points with
y_i >= y_1 - 5 (y_1: the accuracy at the lowest parallelism), then

    AUP = rho_1 * y_1 + 1/2 * sum_{i>=2} (rho_i - rho_{i-1}) * (y_i * W(y_i) + y_{i-1} * W(y_{i-1})),
    W(y) = min(exp(-alpha * (1 - y / y_max)), 1),  alpha = 3,

where y_max is the highest accuracy on the task over every method compared (d3LLM's ``AUP_leaderboard/main.py``
line 63 takes it over all methods of a task). The weight discounts parallelism bought with accuracy, so a fast but
degraded decoder does not win on area alone; a single point scores rho * y.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

ALPHA = 3.0
"""d3LLM's penalty factor for accuracy degradation."""
Y_MIN_OFFSET = 5.0
"""Points more than this many accuracy points below the lowest-parallelism point are left out."""


def accuracy_weight(accuracy: float, y_max: float, alpha: float = ALPHA) -> float:
    """W(y) = min(exp(-alpha (1 - y / y_max)), 1): 1 at the best accuracy, decaying exponentially below it."""
    return min(math.exp(-alpha * (1 - accuracy / y_max)), 1.0)


def accuracy_under_parallelism(points: Sequence[tuple[float, float]], y_max: float | None = None,
                               alpha: float = ALPHA, y_min_offset: float = Y_MIN_OFFSET) -> float:
    """AUP of ``points`` = (parallelism > 0, accuracy in percent) pairs, as d3LLM's ``get_aup`` computes it.

    ``y_max`` defaults to the best accuracy among ``points``; pass the best over every method shown on the task
    to score curves against each other as d3LLM's leaderboard does. Points of equal parallelism keep the order
    given (the sort is stable, as d3LLM's), which decides which of them the next segment starts from. Two choices
    where d3LLM's code would stop: a point below ``y_1 - y_min_offset`` is left out (as the blog's definition says)
    instead of failing the reference code's assertion on the last point, and a point at 0 % contributes 0 (its W
    would divide by ``y_max`` = 0 when every accuracy is 0).
    """
    if not points:
        raise ValueError("AUP needs at least one (parallelism, accuracy) point.")
    for rho, accuracy in points:
        if not (math.isfinite(rho) and rho > 0):
            raise ValueError(f"AUP: parallelism must be a finite number > 0, got {rho}.")
        if not 0 <= accuracy <= 100:
            raise ValueError(f"AUP: accuracy is a percentage in [0, 100], got {accuracy}.")
    if y_max is not None and not 0 <= y_max <= 100:  # NaN fails too
        raise ValueError(f"AUP: y_max is a percentage in [0, 100], got {y_max}.")
    if y_max is not None and y_max < (top := max(accuracy for _, accuracy in points)):
        raise ValueError(f"AUP: y_max={y_max} is below this curve's best accuracy {top}; it is the best accuracy over "
                         "every curve compared, this one's included.")
    ordered = sorted(points, key=lambda point: point[0])
    y_min = ordered[0][1] - y_min_offset
    kept = [(rho, accuracy) for rho, accuracy in ordered if accuracy >= y_min]
    best = max(accuracy for _, accuracy in points) if y_max is None else y_max

    def weighted(accuracy: float) -> float:
        return accuracy * accuracy_weight(accuracy, best, alpha) if accuracy > 0 else 0.0

    area = kept[0][0] * kept[0][1]
    for (rho_prev, y_prev), (rho, y) in pairwise(kept):
        area += 0.5 * (rho - rho_prev) * (weighted(y) + weighted(y_prev))
    return area


__all__ = ["ALPHA", "Y_MIN_OFFSET", "accuracy_under_parallelism", "accuracy_weight"]
