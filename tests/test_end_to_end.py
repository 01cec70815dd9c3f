"""The whole chain: score GSM8K rows with a teacher -> dataset folder -> load_dataset -> collator for a student
with another tokenizer -> one MDLMTrainer step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import GSM8K_TRAIN, read_jsonl, tiny_student
from datasets import Dataset, load_dataset
from helpers_teachers import make_teacher
from helpers_tokenizers import make_tokenizer

from trims_hf import (
    MaskingConfig,
    MDLMConfig,
    MDLMTrainer,
    StudentFormat,
    TrimsDataCollator,
    build_scored_dataset,
    prepare_dataset,
)


@pytest.mark.slow
def test_score_folder_collate_train(tmp_path, tokenizer):
    rows = [{"prompt": r["question"], "completion": r["answer"]} for r in read_jsonl(GSM8K_TRAIN, 20)]
    folder = build_scored_dataset(Dataset.from_list(rows), tmp_path / "scored", teacher="tiny-random-teacher",
                                  loaded_teacher=(make_teacher(tokenizer), tokenizer))
    scored = load_dataset(str(folder), split="train")
    assert len(scored) == 20 and scored[0]["completion"] == rows[0]["completion"]

    student_tokenizer = make_tokenizer([r["prompt"] + "\n" + r["completion"] for r in rows], vocab_size=330)
    n_teacher = len(scored[0]["teacher_nll"])
    n_student = len(student_tokenizer(rows[0]["completion"], add_special_tokens=False)["input_ids"])
    assert n_teacher != n_student  # the tokenizers really differ

    prepared = prepare_dataset(scored, student_tokenizer)
    flat = np.concatenate([row["bucket_ids"][:-1] for row in prepared])  # minus the end-of-response token
    scored_tokens = ~np.isnan(np.concatenate(prepared["student_score"]))  # byte pieces of a split character have none
    counts = np.bincount(flat[scored_tokens], minlength=8)
    assert counts.max() - counts.min() <= 1

    model = tiny_student(student_tokenizer, "dream")
    args = MDLMConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, max_steps=1, report_to="none",
                      use_cpu=True, save_strategy="no", disable_tqdm=True, max_length=512)
    # raw scored rows and rows prepared with the trainer's max_length both train (longer rows are refused by name)
    for train_set in (scored, prepare_dataset(scored, student_tokenizer, StudentFormat(max_length=args.max_length))):
        before = [p.detach().clone() for p in model.parameters()]
        trainer = MDLMTrainer(model, args, train_dataset=train_set, processing_class=student_tokenizer)
        trainer.train()
        assert trainer.state.global_step == 1
        assert np.isfinite(trainer.state.log_history[-1]["train_loss"])
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # Trajectory masking with p_context 0 / p_future 1 masks exactly the completion tokens of buckets > k.
    collator = TrimsDataCollator(student_tokenizer, masking=MaskingConfig(trajectory_ratio=1.0, p_context=0.0, p_future=1.0))
    rows = list(prepared.select(range(4)))
    batch = collator(rows)
    split = 0
    for b, row in enumerate(rows):
        start, buckets = row["prompt_length"], torch.tensor(row["bucket_ids"])
        masked = batch["masked"][b, start:start + len(buckets)]
        k = int(buckets[~masked].max()) if (~masked).any() else -1  # the largest context bucket
        assert masked.any() or k == 7
        assert torch.equal(masked, buckets > k), (b, k)  # an upper set of buckets, not a random subset
        split += bool(0 < masked.sum() < len(masked))
    assert split >= 2  # rows with both context and future tokens: the check above is not vacuous
