"""Tokens per step (the paper's "TPS"; d3LLM's tokens per forward): decoding parallelism.

tokens_per_step = sum of generated tokens / sum of forward passes over all samples: a ratio of
totals, not a mean of per-sample ratios (that mean is reported separately, for reference only).
Generated tokens exclude the prompt, EOS/padding and anything after the task's stop strings; every
model call counts as one forward.

Given ``non_eos_tokens`` it also reports tokens_per_forward_non_eos, the count of the Fast-dLLM /
dParallel / d3LLM evaluation scripts: every response token that is not EOS (so the end-of-turn token
counts, and with early stop off so do non-EOS tokens after it) over the same forwards. Values below 1 are
possible: a response shorter than the forwards spent on it (low thresholds, an all-EOS block decoded).
"""

import evaluate

from trims_hf.evaluation.metrics import metric_info
from trims_hf.generation.hooks import throughput

_DESCRIPTION = "Generated tokens per forward pass, as a ratio of totals over all samples."

_KWARGS_DESCRIPTION = """
Args:
    generated_tokens: per sample, the number of generated tokens (no prompt, no EOS/padding, nothing
        after a stop string).
    forwards: per sample, the number of model forward passes spent on it (>= 1).
    non_eos_tokens: optional, per sample, the response tokens that are not EOS (before a stop string).
Returns:
    tokens_per_step: sum(generated_tokens) / sum(forwards).
    tokens_per_forward_non_eos: sum(non_eos_tokens) / sum(forwards), when non_eos_tokens is given.
    mean_per_sample_tokens_per_step: mean over samples of generated_tokens / forwards (reference).
    total_generated_tokens, total_forwards, num_samples.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TokensPerStep(evaluate.Metric):
    """Named tokens_per_step, never "tps", which elsewhere means tokens per second."""

    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, generated_tokens="int64", forwards="int64")

    def _compute(self, generated_tokens: list[int], forwards: list[int], non_eos_tokens: list[int] | None = None) -> dict:
        if non_eos_tokens is not None and (len(non_eos_tokens) != len(forwards) or min(non_eos_tokens, default=0) < 0):
            raise ValueError("tokens_per_step: non_eos_tokens needs one count >= 0 per sample")
        for i, (tokens, steps) in enumerate(zip(generated_tokens, forwards)):
            if tokens < 0:
                raise ValueError(f"tokens_per_step: generated_tokens[{i}] = {tokens} is negative")
            if steps < 1:
                raise ValueError(f"tokens_per_step: forwards[{i}] = {steps}; every sample needs at least one forward")
        if not forwards:
            raise ValueError("tokens_per_step: no samples")
        total_tokens, total_forwards = sum(generated_tokens), sum(forwards)
        ratios = throughput(total_tokens, sum(non_eos_tokens or ()), total_forwards, seconds=0.0)
        peers = {} if non_eos_tokens is None else {"tokens_per_forward_non_eos": ratios["tokens_per_forward_non_eos"]}
        return {
            "tokens_per_step": ratios["tokens_per_step"],
            **peers,
            "mean_per_sample_tokens_per_step": sum(t / f for t, f in zip(generated_tokens, forwards)) / len(forwards),
            "total_generated_tokens": total_tokens,
            "total_forwards": total_forwards,
            "num_samples": len(forwards),
        }
