"""Does a base compute its solution lines' results, or copy them from where the answer repeats them? Each result
read with the rest visible, with the later numbers masked, and left to right (``regime.py copies``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...settings import StudentFormat

RECALL_VIEWS = ("rest visible", "later numbers masked", "left to right")
"""What a solution line's result (``= N``) is read against (:func:`result_masks`): the rest of the answer visible (a
later line may repeat the result: copying is enough); the template visible but every number from the result on masked
(what the threshold decoder leaves when it commits the template first: the result must be computed); everything from
the result on masked (left-to-right decoding)."""
RESULT = re.compile(r"= (\d+)")
COPIES_ROWS = 100
"""Held-out problems a probe reads :func:`result_recall` on (one forward per problem)."""


def result_masks(completion_spans: Sequence[tuple[int, int]], answer: str, prompt_length: int,
                 length: int) -> list[tuple[list[int], dict[str, list[int]]]]:
    """For each result of ``answer`` (``= N``): its token positions and, per :data:`RECALL_VIEWS`, the positions masked
    in that view. ``completion_spans`` are the completion tokens' character spans (``tokenize_example``); ``length``
    is the tokenised row's length (end-of-response tokens count as "after")."""
    def tokens(a: int, b: int) -> list[int]:  # the tokens overlapping characters [a, b) (a digit's may hold a space)
        return [prompt_length + i for i, (s, e) in enumerate(completion_spans) if s < b and e > a]

    in_number = {p for m in re.finditer(r"\d+", answer) for p in tokens(*m.span())}
    found = []
    for match in RESULT.finditer(answer):
        positions = tokens(*match.span(1))
        if not positions:
            continue
        first = positions[0]
        found.append((positions, {RECALL_VIEWS[0]: positions,
                                  RECALL_VIEWS[1]: sorted({*positions, *(p for p in in_number if p > first)}),
                                  RECALL_VIEWS[2]: list(range(first, length))}))
    return found


def result_recall(model: Any, tokenizer: Any, rows: Sequence[Mapping[str, str]],
                  fmt: StudentFormat | None = None) -> dict[str, Any]:
    """The share of solution-line results a student predicts exactly (every digit its argmax) in each of
    :data:`RECALL_VIEWS`, from one forward per problem: high with the rest visible and low with the later numbers masked
    says the student copies results from where the answer repeats them instead of computing them."""
    import torch

    from ...data.preparation import tokenize_example
    from ...students import mask_token_id, student_spec

    spec, mask = student_spec(model), mask_token_id(model)
    right = dict.fromkeys(RECALL_VIEWS, 0)
    total = 0
    for index, row in enumerate(rows):
        example = tokenize_example(tokenizer, row["question"], row["answer"], fmt, index)
        ids = torch.tensor(example.input_ids)
        cases = result_masks(example.completion_spans, row["answer"], example.prompt_length, len(ids))
        if not cases:
            continue
        batch = ids.repeat(len(cases) * len(RECALL_VIEWS), 1)  # on the CPU; the forward on the model's device
        for case, (_, views) in enumerate(cases):
            for view, name in enumerate(RECALL_VIEWS):
                batch[case * len(RECALL_VIEWS) + view, views[name]] = mask
        with torch.no_grad():
            logits = model(input_ids=batch.to(next(model.parameters()).device)).logits
            predicted = spec.align_logits(logits).argmax(-1).cpu()
        for case, (positions, _) in enumerate(cases):
            for view, name in enumerate(RECALL_VIEWS):
                right[name] += bool(torch.equal(predicted[case * len(RECALL_VIEWS) + view, positions], ids[positions]))
        total += len(cases)
    if not total:
        raise ValueError("no solution line of these rows has a result ('= N') to read")
    return {"results": total, "problems": len(rows), **{name: right[name] / max(total, 1) for name in RECALL_VIEWS}}
