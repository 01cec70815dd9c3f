"""TrimsDataCollator on prepared rows: layout, truncation, padding, labels, reproducibility, errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import synthetic_scored_rows
from datasets import Dataset

from trims_hf import BucketConfig, MaskingConfig, StudentFormat, TrimsDataCollator, prepare_dataset
from trims_hf.data.schema import SchemaError


def collator(tokenizer, seed: int = 0, **masking):
    return TrimsDataCollator(tokenizer, masking=MaskingConfig(**masking), seed=seed)


@pytest.fixture(scope="module")
def scored(gsm8k_rows, tokenizer):
    return synthetic_scored_rows(gsm8k_rows[:32], tokenizer)


@pytest.fixture(scope="module")
def prepared(scored, tokenizer):
    return list(prepare_dataset(Dataset.from_list(scored), tokenizer))


def test_batch_layout(scored, prepared, tokenizer):
    out = collator(tokenizer)(prepared[:4])
    ids, labels, masked = out["input_ids"], out["labels"], out["masked"]
    assert ids.shape == labels.shape == masked.shape == out["attention_mask"].shape
    assert out["loss_weights"].shape == out["t"].shape == out["is_trajectory"].shape == (4,)
    for b, row in enumerate(scored[:4]):
        text = tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}], add_generation_prompt=True,
                                             tokenize=False)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        p, c = len(prompt_ids), len(completion_ids)
        assert torch.equal(ids[b, :p], torch.tensor(prompt_ids))  # the prompt is never masked
        assert torch.all(labels[b, :p] == -100)  # nor counted by the normaliser
        assert labels[b, p:p + c].tolist() == completion_ids  # labels: the clean response, EOS padding included
        assert torch.all(labels[b, p + c:] == tokenizer.eos_token_id)  # end of response + padding
        assert torch.equal(ids[b] == tokenizer.mask_token_id, masked[b])
        assert torch.equal(ids[b][~masked[b]], torch.where(labels[b] != -100, labels[b], ids[b])[~masked[b]])


def test_prepared_buckets_equal_teacher_buckets_for_same_tokenizer(scored, prepared):
    """With teacher tokenizer == student tokenizer, the projection is the identity and the buckets agree."""
    for row, raw in zip(prepared, scored):
        completion = row["bucket_ids"][: len(raw["teacher_bucket"])]
        assert completion == raw["teacher_bucket"]
        assert np.allclose(row["student_score"], raw["teacher_nll"], atol=1e-6)
        assert row["bucket_ids"][len(raw["teacher_bucket"]):] == [7]  # end of response: easiest bucket


@pytest.mark.parametrize("ordering", ["hard_to_easy", "easy_to_hard", "random"])
def test_end_of_response_and_padding_are_revealed_last_under_every_ordering(scored, tokenizer, ordering):
    masking = MaskingConfig(bucket_ordering=ordering, trajectory_ratio=1.0, p_context=0.0, p_future=1.0)
    rows = list(prepare_dataset(Dataset.from_list(scored[:8]), tokenizer, buckets=masking))
    ends = [row["bucket_ids"][len(raw["teacher_nll"]):] for row, raw in zip(rows, scored)]
    assert all(end == [7] for end in ends)  # the one end-of-response token of each row
    tails = []
    for seed in range(6):
        out = TrimsDataCollator(tokenizer, masking=masking, seed=seed)(rows)
        for b, row in enumerate(rows):
            start = row["prompt_length"]
            masked = out["masked"][b, start:]
            buckets = torch.full_like(masked, 7, dtype=torch.long)  # end of response and EOS padding: bucket K - 1
            buckets[:len(row["bucket_ids"])] = torch.tensor(row["bucket_ids"])
            # the masked set is the tokens above one threshold k, the tail included
            assert any(torch.equal(masked, buckets > k) for k in range(-1, 8)), (ordering, seed, b)
            tails.append(bool(masked[len(row["bucket_ids"]) - 1:].all()))
    assert 0 < sum(tails) < len(tails)  # the tail is masked unless k = K - 1


@pytest.mark.parametrize("prepared_k, collator_k, refused", [
    (4, 8, r"row 3: its end-of-response tokens are in bucket 3, the last of rows prepared with num_buckets=4, but the "
           r"masking has num_buckets=8"),
    (8, 4, r"row 0: 'bucket_ids' must lie in \[0, 4\)"), (4, 4, None), (2, 2, None)])
def test_rows_cut_into_another_k_are_refused_by_the_collator(scored, tokenizer, prepared_k, collator_k, refused):
    """A plain Trainer hands the collator rows alone: rows cut into fewer buckets than its masking's have ids that all
    fit, and are told by their end-of-response tokens (the last bucket of their own K, past the scored tokens)."""
    rows = list(prepare_dataset(Dataset.from_list(scored[:4]), tokenizer, buckets=BucketConfig(num_buckets=prepared_k)))
    masking = MaskingConfig(num_buckets=collator_k, trajectory_ratio=0.5)
    if refused is None:
        assert TrimsDataCollator(tokenizer, masking=masking)(rows)["input_ids"].shape[0] == 4
        return
    with pytest.raises(SchemaError, match=refused):
        TrimsDataCollator(tokenizer, masking=masking)(rows[::-1] if collator_k > prepared_k else rows)
    assert TrimsDataCollator(tokenizer, masking=dataclasses.replace(masking, trajectory_ratio=0.0))(rows)["t"].shape == (4,)


def test_a_student_score_not_of_the_rows_preparation_is_named_or_left_alone(scored, tokenizer):
    """The end-token check reads ``student_score`` as one entry per scored token: a list of another length is named
    as not of the rows' preparation (no K is guessed from a mid-completion bucket); a column of that name holding
    one number per row is the user's own, and left alone."""
    row = next(iter(prepare_dataset(Dataset.from_list(scored[:1]), tokenizer)))
    collate = TrimsDataCollator(tokenizer, masking=MaskingConfig(trajectory_ratio=1.0))
    kept = len(row["student_score"])
    assert len(set(row["bucket_ids"][kept - 4:kept])) > 1  # the scored tokens' buckets differ near the end
    with pytest.raises(SchemaError, match=rf"^row 0: 'bucket_ids' past its {kept - 4} 'student_score' entries \(the "
                                          r"end-of-response tokens, in bucket 7\) hold \[.*\]: the two columns are not "
                                          r"of one preparation"):
        collate([{**row, "student_score": row["student_score"][:-4]}])
    for grade in (0.5, torch.tensor(0.5), np.float32(0.5)):
        assert collate([{**row, "student_score": grade}])["input_ids"].shape[0] == 1


def test_truncation_keeps_buckets_aligned_and_equal_mass_over_kept_tokens(scored, prepared, tokenizer):
    cut = max(row["prompt_length"] for row in prepared) + 40
    rows = list(prepare_dataset(Dataset.from_list(scored), tokenizer, StudentFormat(max_length=cut)))
    assert all(len(row["input_ids"]) <= cut for row in rows)
    assert [row["input_ids"] for row in rows] == [row["input_ids"][:cut] for row in prepared]
    kept = np.concatenate([row["bucket_ids"] for row in rows if len(row["input_ids"]) == cut])
    counts = np.bincount(np.concatenate([row["bucket_ids"][: len(row["student_score"])] for row in rows]), minlength=8)
    assert counts.max() - counts.min() <= 1  # quantiles over the tokens training sees, not whole completions
    assert kept.size and 7 in kept
    row = min((row for row in rows if len(row["input_ids"]) == cut), key=lambda row: row["prompt_length"])
    buckets = torch.tensor(row["bucket_ids"])
    assert len(buckets) >= 40 and len(set(row["bucket_ids"])) == 8
    thresholds = set()
    for draw in range(30):
        out = collator(tokenizer, seed=draw, trajectory_ratio=1.0, p_context=0.0, p_future=1.0)([row])
        assert out["input_ids"].shape[1] == cut
        masked = out["masked"][0, row["prompt_length"]:]
        # Exactly the tokens above the sampled threshold bucket k: the buckets are aligned with the kept tokens.
        matching = [k for k in range(8) if torch.equal(masked, buckets > k)]
        assert len(matching) == 1, draw
        thresholds.add(matching[0])
    assert len(thresholds) >= 4  # k really varies


@pytest.mark.parametrize("metric, held, expected", [
    ("entropy", "teacher_nll", r"^column 'teacher_entropy': the rows hold teacher spans but no entropy scores to cut "
                               r"buckets on; they hold nll: set metric=nll\.$"),
    ("nll", "teacher_entropy", r"^column 'teacher_nll': .* no nll scores .*; they hold entropy: set metric=entropy\.$"),
    ("nll", None, r"^column 'teacher_nll': .* no nll scores to cut buckets on; score them with `trims score`\.$"),
])
def test_scored_rows_without_the_metrics_column_are_refused(metric, held, expected, scored, tokenizer):
    """Rows with teacher spans but not the chosen metric's scores would be read as unscored rows: no buckets."""
    dropped = [column for column in ("teacher_nll", "teacher_entropy") if column != held]
    rows = Dataset.from_list(scored[:4]).remove_columns(dropped)
    with pytest.raises(SchemaError, match=expected):
        prepare_dataset(rows, tokenizer, buckets=BucketConfig(metric=metric))
    if held is not None:  # the metric the rows hold prepares them with buckets
        other = "nll" if held == "teacher_nll" else "entropy"
        assert "bucket_ids" in prepare_dataset(rows, tokenizer, buckets=BucketConfig(metric=other)).column_names


def test_ratio_zero_is_plain_mdlm_and_needs_no_scores(gsm8k_rows, prepared, tokenizer):
    plain_rows = list(prepare_dataset(Dataset.from_list(gsm8k_rows[:8]), tokenizer))
    assert "bucket_ids" not in plain_rows[0]
    plain = collator(tokenizer, seed=7, trajectory_ratio=0.0)(plain_rows)
    with_scores = collator(tokenizer, seed=7, trajectory_ratio=0.0)(prepared[:8])
    for key in plain:
        assert torch.equal(plain[key], with_scores[key]), key
    assert not plain["is_trajectory"].any()
    assert torch.allclose(plain["loss_weights"], 1 / plain["t"])
    trims = collator(tokenizer, seed=7, trajectory_ratio=0.1)(prepared[:8])
    standard = ~trims["is_trajectory"]
    assert torch.equal(trims["input_ids"][standard], plain["input_ids"][standard])


def test_reproducible_and_trajectory_share(prepared, tokenizer):
    a, b = collator(tokenizer, seed=11), collator(tokenizer, seed=11)
    first = a(prepared[:8])
    assert torch.equal(first["input_ids"], b(prepared[:8])["input_ids"])  # same seed, epoch and rows: same masks
    assert not torch.equal(collator(tokenizer, seed=12)(prepared[:8])["input_ids"], first["input_ids"])
    b.epoch = 1
    assert not torch.equal(b(prepared[:8])["input_ids"], first["input_ids"])  # next epoch: fresh draw
    flags = []
    for epoch in range(60):
        a.epoch = epoch
        flags.append(a(prepared[:32])["is_trajectory"])
    flags = torch.cat(flags)
    assert abs(flags.float().mean().item() - 0.1) < 5 * (0.09 / len(flags)) ** 0.5


@pytest.mark.parametrize("width", [1, 40, 64, 200])
def test_every_example_id_draws_anew_each_epoch_and_seed(prepared, tokenizer, width):
    """Ids of any length (string hashes of rows prepared elsewhere included) keep the seed and the epoch in the draw,
    and two ids that differ anywhere draw apart."""
    rows = [{**row, "example_id": f"{index}".rjust(width, "x") + "-" + "z" * width} for index, row in enumerate(prepared[:8])]
    draws = {}
    for seed, epoch in [(0, 0), (0, 1), (1, 0)]:
        batch = collator(tokenizer, seed=seed, trajectory_ratio=0.0)
        batch.epoch = epoch
        draws[seed, epoch] = batch(rows)["t"]
    assert len({tuple(t.tolist()) for t in draws.values()}) == 3
    apart = collator(tokenizer)([{**prepared[0], "example_id": prefix + "z" * width} for prefix in "ab"])
    assert apart["t"][0] != apart["t"][1]


def test_a_rows_noise_does_not_depend_on_its_batch_mates(prepared, tokenizer):
    fixed = TrimsDataCollator(tokenizer, masking=MaskingConfig(padding="max_length"), max_length=1024, seed=3)
    whole = fixed(prepared[:8])
    assert whole["input_ids"].shape == (8, 1024)
    shifted = fixed(prepared[1:9])  # same widths: rows 1..7 of one batch are rows 0..6 of the other
    for key in whole:
        assert torch.equal(whole[key][1:], shifted[key][:7]), key
    longest = TrimsDataCollator(tokenizer, seed=3)  # pairs padded to their own longest row: same draws where real
    for start in range(0, 8, 2):
        pair = longest(prepared[start:start + 2])
        for b, row in enumerate(prepared[start:start + 2]):
            n = len(row["input_ids"])
            assert torch.equal(pair["input_ids"][b, :n], whole["input_ids"][start + b, :n])
            assert pair["t"][b] == whole["t"][start + b]
    assert len(set(whole["t"].tolist())) == 8  # each row has its own draw
    twin = {**prepared[0], "example_id": 1000}  # the same tokens under another id: another draw
    assert fixed([twin])["t"][0] != whole["t"][0]


def test_padding_to_max_length(prepared, tokenizer):
    with pytest.raises(ValueError, match="padding='max_length' needs the collator's max_length"):
        TrimsDataCollator(tokenizer, masking=MaskingConfig(padding="max_length"))
    short = TrimsDataCollator(tokenizer, masking=MaskingConfig(padding="max_length"), max_length=200)
    longest_row = max(prepared[:8], key=lambda row: len(row["input_ids"]))
    with pytest.raises(SchemaError, match=rf"row {longest_row['example_id']}: {len(longest_row['input_ids'])} tokens, "
                                          "more than max_length=200"):
        short(prepared[:8])
    longest = TrimsDataCollator(tokenizer, max_length=8)  # padding="longest" too: never passed on uncut
    with pytest.raises(SchemaError, match=rf"row {longest_row['example_id']}: {len(longest_row['input_ids'])} tokens, "
                                          "more than max_length=8; prepare the rows with the same max_length"):
        longest(prepared[:8])
    rounded = TrimsDataCollator(tokenizer, masking=MaskingConfig(padding="max_length", pad_to_multiple_of=64),
                                max_length=1000)
    assert rounded(prepared[:2])["input_ids"].shape == (2, 1024)
    with pytest.raises(ValueError, match="padding='middle'; choose one of longest, max_length"):
        MaskingConfig(padding="middle")


@pytest.mark.parametrize("max_length", [0, -5, 1, 8.0, True])
def test_max_length_is_a_prepared_length(tokenizer, max_length):
    with pytest.raises(ValueError, match=rf"^max_length={max_length!r}: must be a whole number of at least 2"):
        TrimsDataCollator(tokenizer, max_length=max_length)


@pytest.mark.parametrize("settings,error,match", [
    ({"mask_token_id": -1}, ValueError, r"^mask_token_id=-1: token ids are >= 0\.$"),
    ({"mask_token_id": 3.0}, TypeError, r"^mask_token_id=3\.0: must be a whole number \(int\), not float\.$"),
    ({"seed": 1.5}, TypeError, r"^seed=1\.5: must be a whole number \(int\), not float\.$"),
    ({"seed": -1}, ValueError, r"^seed=-1: must be in \[0, 4294967295\]\.$"),
])
def test_collator_settings_refused_before_any_batch(tokenizer, settings, error, match):
    with pytest.raises(error, match=match):
        TrimsDataCollator(tokenizer, **settings)


def test_an_empty_batch_is_one_clear_error(tokenizer):
    with pytest.raises(ValueError, match="^The collator got an empty batch; a batch holds at least one row"):
        collator(tokenizer)([])


def test_fixed_subset_needs_example_id(prepared, tokenizer):
    fixed = collator(tokenizer, trajectory_selection="fixed_subset", trajectory_ratio=0.5)
    with pytest.raises(SchemaError, match="example_id"):
        fixed([{k: v for k, v in row.items() if k != "example_id"} for row in prepared[:2]])
    flags = [fixed(prepared[:16])["is_trajectory"] for _ in range(3)]
    assert torch.equal(flags[0], flags[1]) and torch.equal(flags[1], flags[2])


ROW = {"input_ids": [5, 6, 7, 8], "prompt_length": 2, "bucket_ids": [0, 3]}
COERCED_ROWS = {
    "ids as a string": ({"input_ids": "5678"}, r"'input_ids' must be a list of whole numbers \(token ids, >= 0\), "
                                              r"got '5678'"),
    "the ignore index among ids": ({"input_ids": [5, -100, 7, 8]}, r"'input_ids' must be .* got \[5, -100, 7, 8\]"),
    "a fractional id": ({"input_ids": [5, 6.7, 7, 8]}, r"'input_ids' must be .* got \[5\.0, 6\.7, 7\.0, 8\.0\]"),
    "nested ids": ({"input_ids": [[5, 6], [7, 8]]}, r"'input_ids' must be a list of whole numbers"),
    "a fractional bucket": ({"bucket_ids": [0, 1.7]}, r"'bucket_ids' must be a list of whole numbers \(bucket ids in "
                                                      r"\[0, 8\)\), got \[0\.0, 1\.7\]"),
    "a NaN bucket": ({"bucket_ids": [0, float("nan")]}, r"'bucket_ids' must be .* got \[0\.0, nan\]"),
    "a fractional prompt length": ({"prompt_length": 2.9}, r"'prompt_length'=2\.9: a whole number of prompt tokens"),
    "a boolean prompt length": ({"prompt_length": True}, r"'prompt_length'=True: a whole number"),
}


@pytest.mark.parametrize("case", COERCED_ROWS)
def test_prepared_values_numpy_would_coerce_are_refused_by_row_and_field(case, tokenizer):
    """numpy casts these silently: a string's characters read as ids, -100 dropped from the loss as the ignore index, a
    fraction cut down, NaN a raw cast error. Whole floats (a float column) stay accepted, as the same row in ints."""
    trims = collator(tokenizer)
    changed, message = COERCED_ROWS[case]
    with pytest.raises(SchemaError, match=rf"^row 7: {message}.*\.$"):
        trims([{**ROW, **changed, "example_id": 7}])
    as_floats = {key: [float(v) for v in value] if isinstance(value, list) else float(value) for key, value in ROW.items()}
    assert torch.equal(trims([as_floats])["labels"], trims([ROW])["labels"])


def test_collator_settings_it_would_coerce_are_refused(prepared, tokenizer):
    trims = collator(tokenizer)
    for epoch in (2.7, "5", -1, True):
        with pytest.raises(ValueError, match=rf"^epoch={epoch!r}: a whole number >= 0"):
            trims.epoch = epoch
    with pytest.raises(ValueError, match=r"^epoch=2\.7: a whole number"):
        TrimsDataCollator(tokenizer, epoch=2.7)
    trims.epoch = 3
    assert trims.epoch == 3
    with pytest.raises(ValueError, match=rf"^mask_token_id={tokenizer.eos_token_id} is the tokenizer's EOS id"):
        TrimsDataCollator(tokenizer, mask_token_id=tokenizer.eos_token_id)
    fixed = collator(tokenizer, trajectory_selection="fixed_subset", trajectory_ratio=0.5)
    for example_id in ("abc", 1.9):
        with pytest.raises(SchemaError, match=rf"selects rows by their integer 'example_id'; got {example_id!r}\.$"):
            fixed([{**prepared[0], "example_id": example_id}])


def test_mask_token_text_in_a_completion_or_as_its_end_is_refused(scored, tokenizer):
    """The tokenizer reads the mask token's text as the mask id: as a training target it would teach the student to
    leave positions masked; as the end of a response it would never end one."""
    with pytest.raises(SchemaError, match=rf"^row 1: the completion holds the mask token's text "
                                          rf"{tokenizer.mask_token!r}"):
        prepare_dataset(Dataset.from_list([scored[0], {**scored[1], "completion": f"the answer {tokenizer.mask_token} is 3"}]),
                        tokenizer)
    with pytest.raises(ValueError, match=rf"End-of-response token {tokenizer.mask_token!r} is the mask token"):
        prepare_dataset(Dataset.from_list(scored[:1]), tokenizer, StudentFormat(end_of_response=[tokenizer.mask_token]))


@pytest.mark.parametrize("data_format", ["torch", "numpy"])
def test_rows_read_in_a_tensor_format_collate_as_lists_do(tokenizer, data_format):
    rows = [{"input_ids": [5, 6, 7, 8, 9], "prompt_length": 2, "bucket_ids": [0, 1, 2], "example_id": i} for i in range(2)]
    formatted = Dataset.from_list(rows).with_format(data_format)
    batch, expected = collator(tokenizer)([formatted[0], formatted[1]]), collator(tokenizer)(rows)
    assert batch.keys() == expected.keys() and all(torch.equal(batch[key], expected[key]) for key in batch)


def test_bad_rows_give_clear_errors(scored, tokenizer):
    trims = collator(tokenizer)
    with pytest.raises(SchemaError, match=r"row 0: not prepared for the student.*prepare_dataset"):
        trims(scored[:1])
    missing = {key: value for key, value in scored[0].items() if key != "teacher_nll"}
    with pytest.raises(SchemaError, match=r"row 1.*teacher_nll"):
        prepare_dataset(Dataset.from_list([scored[1], missing]), tokenizer)
    misaligned = {**scored[1], "teacher_nll": scored[1]["teacher_nll"][:-2]}
    with pytest.raises(SchemaError, match=r"row 0: per-token fields have different lengths"):
        prepare_dataset(Dataset.from_list([misaligned]), tokenizer)
    with pytest.raises(SchemaError, match=r"row 1: field 'completion' is empty"):
        prepare_dataset(Dataset.from_list([scored[2], {**scored[3], "completion": "  "}]), tokenizer)
    with pytest.raises(SchemaError, match="row 0: the prompt has .* tokens, leaving no room"):
        prepare_dataset(Dataset.from_list(scored[:1]), tokenizer, StudentFormat(max_length=4))
    prepared = {"input_ids": [1, 2, 3, 4], "prompt_length": 2, "bucket_ids": [0], "example_id": 41}
    with pytest.raises(SchemaError, match=r"row 41: 'bucket_ids' has 1 entries but there are 2 completion tokens"):
        trims([prepared])
    with pytest.raises(SchemaError, match="row 0: missing field 'bucket_ids'"):
        trims([{"input_ids": [1, 3, 4], "prompt_length": 1}])
    mask = tokenizer.mask_token_id
    with pytest.raises(SchemaError, match=rf"^row 7: the completion holds the mask token id {mask}: a target of the "):
        trims([{"input_ids": [1, 3, mask, 4], "prompt_length": 2, "bucket_ids": [0, 1], "example_id": 7}])
    trims([{"input_ids": [1, mask, 3, 4], "prompt_length": 2, "bucket_ids": [0, 1]}])  # a prompt may show it
    with pytest.raises(SchemaError, match=rf"^row 0: 'input_ids' holds {10**9}, past the tokenizer's {len(tokenizer)} "):
        trims([{"input_ids": [1, 3, 10**9], "prompt_length": 1, "bucket_ids": [0, 1]}])
    with pytest.raises(SchemaError, match="row 0: the prompt has no tokens"):
        collator(tokenizer, trajectory_ratio=0.0)([{"input_ids": [5, 6, 7], "prompt_length": 0}])
    out_of_range = {"input_ids": [1, 2, 3, 4], "prompt_length": 2, "bucket_ids": [0, 9]}
    with pytest.raises(SchemaError, match=r"row 0: 'bucket_ids' must lie in \[0, 8\)"):
        trims([out_of_range])
