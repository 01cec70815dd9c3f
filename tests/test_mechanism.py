"""What trajectory rows teach (trims_hf.studies.mechanism): the reads of a row, and the gain on students whose answer is known."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import synthetic_scored_rows, tiny_student
from datasets import Dataset

from trims_hf import prepare_dataset
from trims_hf.data.schema import SchemaError
from trims_hf.studies.mechanism import commit_profile, measure_future_gain, token_scores, trajectory_views

MASK, VOCAB = 99, 100


def test_each_threshold_reveals_the_context_buckets_and_the_last_read_masks_the_whole_response():
    ids = torch.tensor([5, 6, 7, 8, 9, 10, 11])
    response = torch.tensor([False, False, True, True, True, True, True])  # 2 prompt tokens, 4 read, 1 end token
    read = torch.tensor([False, False, True, True, True, True, False])
    buckets = torch.tensor([-1, -1, 2, 0, 1, 2, 3])  # the end token in the last bucket
    views, future = trajectory_views(ids, response, read, buckets, [0, 1, 2], MASK)
    assert views.tolist() == [[5, 6, MASK, 8, MASK, MASK, MASK],
                              [5, 6, MASK, 8, 9, MASK, MASK],
                              [5, 6, 7, 8, 9, 10, MASK],
                              [5, 6, MASK, MASK, MASK, MASK, MASK]]
    assert future.tolist() == [[False, False, True, False, True, True, False],
                               [False, False, True, False, False, True, False],
                               [False] * 7]


def test_scores_of_uniform_and_certain_logits():
    logits = torch.zeros(2, 3, 4)
    logits[1, :, 2] = 50.0
    targets = torch.tensor([[0, 1, 2], [2, 2, 0]])
    logprob, confidence = token_scores(logits, targets)
    assert torch.allclose(logprob[0], torch.full((3,), -math.log(4)))
    assert torch.allclose(confidence[0], torch.full((3,), 0.25))
    assert torch.allclose(logprob[1, :2], torch.zeros(2), atol=1e-6) and logprob[1, 2] < -40
    assert torch.allclose(confidence[1], torch.ones(3))


class ContextReader(torch.nn.Module):
    """A student whose answer is known: at a masked completion position it gives the right token probability
    ``seen`` when some completion token is visible and ``unseen`` when none is, the rest spread evenly."""

    def __init__(self, answers: list[list[int]], prompt_length: int, seen: float, unseen: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.answers, self.prompt_length, self.seen, self.unseen = answers, prompt_length, seen, unseen
        self.config = SimpleNamespace(trims_student="llada", mask_token_id=MASK)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        answer = next(a for a in self.answers if len(a) == input_ids.shape[1])
        visible = (input_ids[:, self.prompt_length:-1] != MASK).any(-1)  # the last token is the end of response
        right = torch.where(visible, self.seen, self.unseen)[:, None]
        probs = ((1 - right) / (VOCAB - 1))[..., None].expand(*input_ids.shape, VOCAB).clone()
        probs.scatter_(-1, torch.tensor(answer).expand_as(input_ids)[..., None], right[..., None].expand(*input_ids.shape, 1))
        return SimpleNamespace(logits=probs.log())


def known_rows(num_buckets: int) -> list[dict]:
    """Rows of 2 prompt tokens, a completion with every bucket present, and one end-of-response token."""
    rows = []
    for length in (num_buckets, num_buckets + 3):
        buckets = [i % num_buckets for i in range(length)]
        rows.append({"input_ids": [1, 2, *range(10, 10 + length), 3], "prompt_length": 2,
                     "bucket_ids": [*buckets, num_buckets - 1], "student_score": [0.0] * length})
    return rows


@pytest.mark.parametrize(("seen", "unseen"), [(0.9, 0.3), (0.5, 0.5), (0.2, 0.6)])
def test_the_gain_is_what_the_revealed_context_adds(seen, unseen):
    rows = known_rows(4)
    model = ContextReader([r["input_ids"] for r in rows], 2, seen, unseen)
    gain = measure_future_gain(model, rows, 4)
    assert gain.thresholds == [0, 1, 2]
    assert gain.pooled["revealed_logprob"] == pytest.approx(math.log(seen), abs=1e-5)
    assert gain.pooled["masked_logprob"] == pytest.approx(math.log(unseen), abs=1e-5)
    assert gain.pooled["gain_logprob"] == pytest.approx(math.log(seen) - math.log(unseen), abs=1e-5)
    assert gain.pooled["gain_confidence"] == pytest.approx(seen - unseen, abs=1e-5)
    # future tokens, bucket > k: row 1 holds buckets 0-3 once, row 2 buckets 0-2 twice and 3 once
    assert [t["tokens"] for t in gain.per_threshold] == [3 + 5, 2 + 3, 1 + 1]
    assert [r["tokens"] for r in gain.per_row] == [6, 9] and gain.pooled["tokens"] == 15


def test_every_reading_equals_a_forward_written_out_on_a_real_student(gsm8k_rows, tokenizer):
    rows = list(prepare_dataset(Dataset.from_list(synthetic_scored_rows(gsm8k_rows[:3], tokenizer, num_buckets=4)),
                                tokenizer))
    model = tiny_student(tokenizer, "dream").eval()  # a shifted student: logits realigned
    gain = measure_future_gain(model, rows, 4)
    mask = tokenizer.mask_token_id
    for k in range(3):
        sums, count = {"revealed": 0.0, "masked": 0.0}, 0
        for row in rows:
            ids, start, kept = row["input_ids"], row["prompt_length"], len(row["student_score"])
            later = [i for i in range(start, len(ids)) if row["bucket_ids"][i - start] > k]  # end tokens included
            future = [i for i in later if i < start + kept]
            reads = {"revealed": [mask if i in later else t for i, t in enumerate(ids)],
                     "masked": [mask if i >= start else t for i, t in enumerate(ids)]}
            for name, read in reads.items():
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([read])).logits[0]
                logprobs = torch.log_softmax(logits.float(), -1)
                sums[name] += sum(float(logprobs[i - 1, ids[i]]) for i in future)  # Dream: position i - 1 predicts i
            count += len(future)
        reading = gain.per_threshold[k]
        assert reading["tokens"] == count > 0
        assert reading["revealed_logprob"] == pytest.approx(sums["revealed"] / count, abs=1e-5)
        assert reading["masked_logprob"] == pytest.approx(sums["masked"] / count, abs=1e-5)


def test_rows_without_buckets_are_refused_naming_the_row():
    rows = known_rows(4)
    model = ContextReader([r["input_ids"] for r in rows], 2, 0.5, 0.5)
    del rows[1]["bucket_ids"]
    with pytest.raises(SchemaError, match="row 1: no 'bucket_ids'"):
        measure_future_gain(model, rows, 4)


def test_commits_are_grouped_by_their_teacher_bucket_with_lateness_and_confidence():
    thresholds = np.array([3.0, 1.0])  # hard-to-easy, 3 buckets: NLL above 3, in (1, 3], at most 1
    nll = np.array([5.0, 0.2, 2.0, 4.0, 0.5, 1.5])
    lateness = np.array([0.0, 4.0, 2.0, 1.0, 6.0, 3.0])
    confidence = np.array([0.6, 0.99, 0.8, np.nan, 0.97, 0.9])  # the NaN: an EOS fill
    profile = commit_profile(nll, lateness, confidence, thresholds, 3)
    assert [p["tokens"] for p in profile] == [2, 2, 2]
    assert [p["lateness"] for p in profile] == [0.5, 2.5, 5.0]  # hard first: lateness rising with the bucket
    assert [p["confidence"] for p in profile] == pytest.approx([0.6, 0.85, 0.98])  # bucket 0's NaN left out
    unscored = commit_profile(np.append(nll, np.nan), np.append(lateness, 9.0), np.append(confidence, 0.1), thresholds, 3)
    assert unscored == profile  # a token without a teacher NLL is in no bucket
    empty = commit_profile(np.zeros(0), np.zeros(0), np.zeros(0), thresholds, 3)
    assert [p["tokens"] for p in empty] == [0, 0, 0] and all(math.isnan(p["lateness"]) for p in empty)
