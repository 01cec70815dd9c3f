"""Teacher scoring math (paper §3.1): per completion token, the teacher's NLL and predictive entropy.

Pure functions with no model loading: the chunked NLL/entropy reduction over hidden states (the
``batch x length x vocab`` float32 tensor never exists), length-sorted batch planning under a token
budget, and padding. :mod:`trims_hf.data.teacher` applies them to a loaded model; :mod:`trims_hf.data.score_job`
is the resumable ``trims score`` job around both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EncodedRow:
    """One row tokenised for the teacher: prompt + completion ids and each completion token's character span."""

    index: int
    input_ids: tuple[int, ...]
    prompt_length: int
    spans: tuple[tuple[int, int], ...]
    truncated: bool

    @property
    def completion_ids(self) -> tuple[int, ...]:
        return self.input_ids[self.prompt_length :]


def plan_batches(lengths: Sequence[int], max_tokens_per_batch: int) -> list[list[int]]:
    """Length-sorted batches whose padded size (rows x longest) stays within the token budget.

    Sorting longest first makes rows of one batch nearly equal in length, so padding is small.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens_per_batch:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def padding_efficiency(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Real tokens over padded tokens (1.0 = no padding)."""
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    return sum(lengths) / padded


def collate(rows: Sequence[EncodedRow], pad_token_id: int, padding_side: str = "right") -> dict[str, torch.Tensor]:
    """Pad to the longest row; position ids count real tokens only, so left and right padding score the same."""
    width = max(len(row.input_ids) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        n = len(row.input_ids)
        cols = slice(width - n, width) if padding_side == "left" else slice(0, n)
        input_ids[b, cols] = torch.tensor(row.input_ids)
        attention_mask[b, cols] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


def token_scores(
    hidden: torch.Tensor, targets: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """NLL of ``targets`` and entropy of the predictive distribution, from the hidden states that predict them.

    ``hidden`` is ``(n, d)`` and ``head`` maps it to finite float32 logits; only ``chunk_size x vocab`` logits
    exist at once. With ``z = logits - max`` and ``s = sum(exp(z))``: ``nll = log s - z[target]`` and
    ``entropy = log s - sum(exp(z) * z) / s``, which needs three vocab-sized buffers and no log-softmax copy.
    """
    nll, entropy = [], []
    for start in range(0, targets.numel(), chunk_size):
        z = head(hidden[start : start + chunk_size])
        z = z.sub_(z.amax(dim=-1, keepdim=True))
        exp_z = z.exp()
        total = exp_z.sum(-1)
        log_total = total.log()
        nll.append(log_total - z.gather(-1, targets[start : start + chunk_size, None]).squeeze(-1))
        entropy.append(log_total - (exp_z * z).sum(-1) / total)  # not bmm: its CPU accumulation loses ~1e-4 here
    return torch.cat(nll), torch.cat(entropy)
