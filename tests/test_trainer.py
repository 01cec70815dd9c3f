"""MDLMTrainer and the plain Trainer path: the loss against a hand-computed reference, both trainers equal,
any split of a global batch equal, Dream shift, training and its logged statistics."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from conftest import needs_deepspeed, synthetic_scored_rows, tiny_student
from datasets import Dataset
from transformers import Trainer, TrainingArguments

from trims_hf import (
    BucketConfig,
    CollatorEpochCallback,
    MaskingConfig,
    MDLMConfig,
    MDLMTrainer,
    StudentFormat,
    TrimsDataCollator,
    prepare_dataset,
    prepare_student,
)
from trims_hf.data.schema import SchemaError


def make_args(tmp_path, **overrides) -> MDLMConfig:
    defaults = dict(output_dir=str(tmp_path), learning_rate=1e-3, max_steps=1,
                    logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
                    lr_scheduler_type="constant", optim="sgd", weight_decay=0.0)
    if overrides.get("global_batch_size") is None:  # a searched split is left unset
        defaults["per_device_train_batch_size"] = 8
    return MDLMConfig(**(defaults | overrides))


@pytest.fixture(scope="module")
def scored(gsm8k_rows, tokenizer):
    return synthetic_scored_rows(gsm8k_rows, tokenizer)


@pytest.fixture(scope="module")
def prepared(scored, tokenizer):
    return list(prepare_dataset(Dataset.from_list(scored), tokenizer))


def reference_per_sample(model, batch, shift: bool) -> torch.Tensor:
    """Each sample's weighted cross-entropy over its masked tokens, written out position by position."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    samples = []
    for b in range(logits.shape[0]):
        sample = torch.zeros(())
        for i in range(logits.shape[1]):
            if not batch["masked"][b, i]:
                continue
            source = max(i - 1, 0) if shift else i
            sample = sample + F.cross_entropy(logits[b, source].float(), batch["labels"][b, i])
        samples.append(sample * batch["loss_weights"][b])
    return torch.stack(samples)


def reference_loss(model, batch, shift: bool, normalization: str = "token") -> torch.Tensor:
    """The MDLM/TRIMS objective: token (or sequence) normalised sum of the per-sample losses."""
    per_sample = reference_per_sample(model, batch, shift)
    response = batch["labels"] != -100
    if normalization == "sequence":
        return (per_sample / response.sum(1)).mean()
    return per_sample.sum() / response.sum()


@pytest.mark.parametrize("kind,normalization", [("llada", "token"), ("dream", "token"), ("llada", "sequence"),
                                                ("masked_lm", "token")])
def test_loss_matches_reference(tmp_path, tokenizer, scored, prepared, kind, normalization):
    model = tiny_student(tokenizer, kind)
    trainer = MDLMTrainer(model, make_args(tmp_path, loss_normalization=normalization, trajectory_ratio=0.5),
                          train_dataset=Dataset.from_list(scored), processing_class=tokenizer)
    batch = trainer.data_collator(prepared[:6])
    assert batch["is_trajectory"].any() and (~batch["is_trajectory"]).any()
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch)
        expected = reference_loss(model, batch, shift=(kind == "dream"), normalization=normalization)
    assert torch.allclose(loss, expected, rtol=1e-5), (loss, expected)


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_mixed_precision_upcasts_only_the_masked_logits(tmp_path, tokenizer, scored, prepared, kind):
    """Under accelerate's bf16 mixed precision (what ``bf16=True`` and the accelerate YAMLs run) the model's outputs
    are upcast to fp32 whole; the training forward returns the masked tokens' logits only, so that copy is [1, M,
    vocab], not [B, L, vocab]; the loss is the fp32 one within bf16 rounding."""
    model = tiny_student(tokenizer, kind)
    batch = TrimsDataCollator(tokenizer)(prepared[:4])
    with torch.no_grad():
        expected = MDLMTrainer(model, make_args(tmp_path), processing_class=tokenizer).compute_loss(model, batch)
    trainer = MDLMTrainer(model, make_args(tmp_path, bf16=True), processing_class=tokenizer)
    prepared_model = trainer.accelerator.prepare_model(model)  # as Trainer.train does
    seen = []
    handle = prepared_model.register_forward_hook(lambda module, args, output: seen.append(output.logits))
    with torch.no_grad():
        loss = trainer.compute_loss(prepared_model, batch)
        trainer.compute_loss(prepared_model, batch, return_outputs=True)  # evaluation keeps every position's logits
    handle.remove()
    masked, vocab = int(batch["masked"].sum()), model.config.vocab_size
    assert [(x.dtype, tuple(x.shape)) for x in seen] == [
        (torch.float32, (1, masked, vocab)), (torch.float32, (*batch["input_ids"].shape, vocab))]
    assert float(loss) == pytest.approx(float(expected), rel=2e-2) and float(loss) != float(expected)  # bf16 ran


def test_dream_shift_reads_previous_position(tmp_path, tokenizer, scored, prepared):
    model = tiny_student(tokenizer, "dream")
    trainer = MDLMTrainer(model, make_args(tmp_path), processing_class=tokenizer)
    batch = trainer.data_collator(prepared[:8])
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # peaked logits: neighbouring positions predict clearly different tokens
        loss = trainer.compute_loss(model, batch)  # the training path: the head runs at the masked tokens' sources
        shifted = reference_loss(model, batch, shift=True)
        unshifted = reference_loss(model, batch, shift=False)
    assert torch.allclose(loss, shifted, rtol=1e-5)
    assert abs(float(loss - unshifted)) / float(shifted) > 1e-3  # the unshifted reading: 100x that tolerance away


def flat_weights(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def one_step(tmp_path, tokenizer, rows, kind: str = "llada", trainer_class=MDLMTrainer, per_device: int = 8,
             accumulation: int = 1, accepts_kwargs: bool | None = None, max_length: int | None = None,
             searched: tuple[int, int] | None = None, **masking):
    """One optimizer step of a fresh tiny student on ``rows`` (in order) with the real collator: (loss, weights).
    ``searched`` = (global batch, rows that fit): the split comes from MDLMTrainer's batch search instead."""
    model = tiny_student(tokenizer, kind, seed=1)
    settings = dict(output_dir=str(tmp_path), max_steps=1, learning_rate=0.1, optim="sgd",
                    lr_scheduler_type="constant", weight_decay=0.0, logging_steps=1, save_strategy="no",
                    report_to="none", use_cpu=True, seed=0, disable_tqdm=True, remove_unused_columns=False,
                    train_sampling_strategy="sequential")
    if searched is None:
        args = TrainingArguments(**settings, per_device_train_batch_size=per_device,
                                 gradient_accumulation_steps=accumulation)
    else:
        args = MDLMConfig(**settings, global_batch_size=searched[0], max_length=max_length)
        out_of_memory_above(model, searched[1])
    collator = TrimsDataCollator(tokenizer, masking=MaskingConfig(**masking), max_length=max_length)
    trainer = trainer_class(model=model, args=args, data_collator=collator, train_dataset=Dataset.from_list(rows),
                            callbacks=[CollatorEpochCallback(collator)] if trainer_class is Trainer else None)
    if accepts_kwargs is not None:
        trainer.model_accepts_loss_kwargs = accepts_kwargs
    trainer.train()
    return trainer.state.log_history[0]["loss"], flat_weights(model)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llada", "dream", "masked_lm"])
def test_plain_trainer_trains_the_mdlm_objective(tmp_path, tokenizer, prepared, kind):
    """Trainer(..., data_collator=TrimsDataCollator(tok)) == MDLMTrainer: same loss, same step, also under GA."""
    rows = prepared[:16]  # different lengths: the two accumulated micro-batches differ in width and tokens
    start = flat_weights(tiny_student(tokenizer, kind, seed=1))
    results = {}
    for trainer_class in (MDLMTrainer, Trainer):
        for per_device, accumulation in ((16, 1), (8, 2)):
            results[trainer_class, accumulation] = one_step(tmp_path / f"{trainer_class.__name__}{accumulation}",
                                                            tokenizer, rows, kind, trainer_class, per_device,
                                                            accumulation, trajectory_ratio=0.5)
    for accumulation in (1, 2):
        (mdlm_loss, mdlm_weights), (plain_loss, plain_weights) = (results[MDLMTrainer, accumulation],
                                                                  results[Trainer, accumulation])
        assert plain_loss == pytest.approx(mdlm_loss, rel=1e-5), (kind, accumulation)
        assert torch.allclose(plain_weights, mdlm_weights, atol=1e-6), (kind, accumulation)
        assert (mdlm_weights - start).abs().max() > 1e-3  # the step moved the weights far beyond the tolerance
    batch = TrimsDataCollator(tokenizer, masking=MaskingConfig(trajectory_ratio=0.5))(rows)
    with torch.no_grad():
        expected = reference_loss(tiny_student(tokenizer, kind, seed=1), batch, shift=(kind == "dream"))
    assert results[Trainer, 1][0] == pytest.approx(expected.item(), rel=1e-5)


def two_epochs(tmp_path, tokenizer, rows, trainer_class, workers: int = 0, persistent: bool = False,
               follow: bool = True) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Two epochs of a fresh tiny student on ``rows`` (same order each epoch): the noised input of every step, and
    the weights after them."""
    model = tiny_student(tokenizer, "llada", seed=1)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, num_train_epochs=2,
                             learning_rate=0.1, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0,
                             save_strategy="no", report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
                             remove_unused_columns=False, train_sampling_strategy="sequential",
                             dataloader_num_workers=workers, dataloader_persistent_workers=persistent)
    collator = TrimsDataCollator(tokenizer, masking=MaskingConfig(trajectory_ratio=0.5))
    callbacks = [CollatorEpochCallback(collator)] if follow and trainer_class is Trainer else None
    trainer = trainer_class(model=model, args=args, data_collator=collator, train_dataset=Dataset.from_list(rows),
                            callbacks=callbacks)
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].clone()),
                                    with_kwargs=True)
    trainer.train()
    return seen, flat_weights(model)


@pytest.mark.parametrize("trainer_class,workers,persistent", [(MDLMTrainer, 2, True), (Trainer, 0, False),
                                                              (Trainer, 2, False), (Trainer, 2, True)])
@pytest.mark.slow
def test_every_epoch_draws_fresh_masks_as_mdlm_trainer_does(tmp_path, tokenizer, prepared, trainer_class, workers,
                                                            persistent):
    """Over two epochs, with DataLoader workers (persistent or not) and without, a plain Trainer given the
    collator's epoch callback noises every row as MDLMTrainer does: fresh masks in the second epoch, same weights."""
    rows = prepared[:8]
    reference_inputs, reference_weights = two_epochs(tmp_path / "reference", tokenizer, rows, MDLMTrainer)
    inputs, weights = two_epochs(tmp_path / "run", tokenizer, rows, trainer_class, workers, persistent)
    assert len(inputs) == len(reference_inputs) == 4  # 2 steps per epoch
    for first, second in zip(inputs[:2], inputs[2:]):  # the same rows in the same order, one epoch apart
        assert first.shape == second.shape and not torch.equal(first, second)
    assert all(torch.equal(a, b) for a, b in zip(inputs, reference_inputs))
    assert torch.allclose(weights, reference_weights, atol=1e-6)


def test_sequences_past_the_students_positions_are_refused_on_both_paths(tmp_path, tokenizer, prepared):
    """A rotary student runs past its position embeddings without complaint, on positions it never saw: MDLMTrainer
    refuses a collator max_length past them when built, and either path refuses a longer batch before its forward."""
    model = tiny_student(tokenizer, seed=1)
    model.config.max_position_embeddings = 64
    rows = [row for row in prepared if len(row["input_ids"]) > 64][:2]
    with pytest.raises(ValueError, match=r"^max_length=128: more than the 64 positions of the student "
                                         r"\(max_position_embeddings\); set it to at most 64$"):
        MDLMTrainer(model, make_args(tmp_path, padding="max_length", max_length=128), processing_class=tokenizer)
    with pytest.raises(ValueError, match=r"^train_dataset: a row of \d+ tokens \(rows are prepared up to max_length\): "
                                         r"more than the 64 positions of the student"):
        MDLMTrainer(model, make_args(tmp_path), train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    batch = TrimsDataCollator(tokenizer)(rows)  # padding='longest', no max_length: the batch is checked
    width = batch["input_ids"].shape[1]
    refusal = rf"^a batch of {width} tokens \(the collator's max_length, or its longest row with padding='longest'\): " \
              r"more than the 64 positions of the student"
    forwards = []
    model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    with pytest.raises(ValueError, match=refusal):
        model(**batch)  # a plain transformers.Trainer's call
    trainer = MDLMTrainer(model, make_args(tmp_path), data_collator=TrimsDataCollator(tokenizer))
    with pytest.raises(ValueError, match=refusal):
        trainer.compute_loss(model, batch)
    assert forwards == []
    model.config.max_position_embeddings = width
    trainer = MDLMTrainer(model, make_args(tmp_path), data_collator=TrimsDataCollator(tokenizer))
    with torch.no_grad():
        assert model(**batch).loss > 0 and trainer.compute_loss(model, batch) > 0  # at the limit: trained
    plain = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", remove_unused_columns=False)
    fitting = MDLMTrainer(model, plain, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    assert len(fitting.train_dataset) == 2  # rows that fit are trained, though the default max_length (1024) does not


@needs_deepspeed
@pytest.mark.slow
def test_building_the_trainer_without_an_accelerator_prints_nothing_of_deepspeed(saved_student, tmp_path):
    """The Trainer asks accelerate to unwrap the model, which imports DeepSpeed where it is installed, and DeepSpeed
    left to guess prints that it found no GPU; MDLMTrainer names the CPU first (a process of its own: DeepSpeed reads
    the setting when it is first imported)."""
    script = ("import sys\nfrom trims_hf import MDLMConfig, MDLMTrainer, load_student, load_student_tokenizer\n"
              f"model = load_student({saved_student!r})\n"
              f"MDLMTrainer(model, MDLMConfig(output_dir={str(tmp_path)!r}, use_cpu=True, report_to='none'), "
              f"processing_class=load_student_tokenizer({saved_student!r}))\n"
              "print('deepspeed' in sys.modules)\n")
    env = {name: value for name, value in os.environ.items() if name != "DS_ACCELERATOR"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]  # DeepSpeed was imported
    if not torch.accelerator.is_available():  # where DeepSpeed finds one, it has nothing to say
        assert "unable to detect" not in done.stdout + done.stderr


def test_plain_trainer_without_the_epoch_callback_stops_at_the_first_step(tmp_path, tokenizer, prepared):
    """Nothing would advance the collator's epoch: the plain Trainer stops with the fix, instead of repeating masks."""
    with pytest.raises(ValueError, match="CollatorEpochCallback"):
        two_epochs(tmp_path, tokenizer, prepared[:8], Trainer, follow=False)


@pytest.mark.parametrize("lora", [False, True], ids=["student", "lora"])
@pytest.mark.parametrize("taken_by", [{"label_smoothing_factor": 0.1}, {"compute_loss_func": True}])
def test_plain_trainer_that_takes_the_labels_stops_before_the_forward(taken_by, lora, tmp_path, tokenizer, prepared):
    """transformers' Trainer pops ``labels`` for its label smoother or a ``compute_loss_func``, which would then score
    every response position (not the masked ones) with a loss of its own: refused, naming both settings; also
    under peft's causal-LM wrapper, which passes the student ``labels=None``."""
    from peft import get_peft_model

    from trims_hf import lora_config

    student = tiny_student(tokenizer, "llada")
    forwards = []
    student.model.register_forward_pre_hook(lambda *args: forwards.append(1))  # the inner model: after our pre-hook
    model = get_peft_model(student, lora_config(student, r=4)) if lora else student
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, report_to="none",
                             use_cpu=True, save_strategy="no", disable_tqdm=True, remove_unused_columns=False,
                             label_smoothing_factor=taken_by.get("label_smoothing_factor", 0.0))
    collator = TrimsDataCollator(tokenizer)
    loss_func = (lambda outputs, labels, num_items_in_batch=None: outputs.logits.sum()) \
        if "compute_loss_func" in taken_by else None
    trainer = Trainer(model=model, args=args, data_collator=collator, train_dataset=Dataset.from_list(prepared[:4]),
                      callbacks=[CollatorEpochCallback(collator)], compute_loss_func=loss_func)
    with pytest.raises(ValueError, match=r"^a TrimsDataCollator batch reached the model without its 'labels': .* "
                                         r"leave label_smoothing_factor at 0 and compute_loss_func unset\.$"):
        trainer.train()
    assert forwards == []


class TupleStudent(torch.nn.Module):
    """A student whose forward returns a plain tuple, as remote code without ModelOutput may."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids, attention_mask=None):
        return (self.inner(input_ids=input_ids, attention_mask=attention_mask).logits,)


def test_plain_trainer_refuses_a_student_without_logits(tmp_path, tokenizer, prepared):
    model = prepare_student(TupleStudent(tiny_student(tokenizer, "llada")), "llada")
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, report_to="none",
                             use_cpu=True, save_strategy="no", disable_tqdm=True, remove_unused_columns=False)
    collator = TrimsDataCollator(tokenizer)
    trainer = Trainer(model=model, args=args, data_collator=collator, train_dataset=Dataset.from_list(prepared[:4]),
                      callbacks=[CollatorEpochCallback(collator)])
    with pytest.raises(ValueError, match="does not return .* logits .* use trims_hf.MDLMTrainer"):
        trainer.train()


def test_plain_trainer_dropping_columns_gets_a_clear_error(tmp_path, tokenizer, prepared):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, report_to="none",
                             use_cpu=True, save_strategy="no", disable_tqdm=True)  # remove_unused_columns=True
    trainer = Trainer(model=tiny_student(tokenizer), args=args, data_collator=TrimsDataCollator(tokenizer),
                      train_dataset=Dataset.from_list(prepared[:4]))
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        trainer.train()


@pytest.fixture(scope="module")
def uneven(scored, tokenizer):
    """32 rows of 155-631 tokens, prepared with max_length 640 (nothing cut)."""
    rows = list(prepare_dataset(Dataset.from_list(scored[:32]), tokenizer, StudentFormat(max_length=640)))
    assert len({len(row["input_ids"]) for row in rows}) > 20
    return rows


def test_normaliser_depends_on_the_split_only_with_longest_padding(tokenizer, uneven):
    def tokens(collator, size):
        return [int((collator(uneven[i:i + size])["labels"] != -100).sum()) for i in range(0, 32, size)]

    longest = TrimsDataCollator(tokenizer)
    fixed = TrimsDataCollator(tokenizer, masking=MaskingConfig(padding="max_length"), max_length=640)
    real = sum(len(row["input_ids"]) - row["prompt_length"] for row in uneven)
    prompts = sum(row["prompt_length"] for row in uneven)
    assert sum(tokens(fixed, 32)) == sum(tokens(fixed, 8)) == sum(tokens(fixed, 1)) == 32 * 640 - prompts
    assert sum(tokens(longest, 1)) == real  # batch 1: no padding at all
    assert sum(tokens(longest, 32)) > sum(tokens(longest, 8)) > real  # padding to each micro-batch's longest row


@pytest.mark.slow
@pytest.mark.parametrize("padding", ["max_length", "train_on_padding=False"])
def test_any_split_of_the_global_batch_trains_the_same_objective(tmp_path, tokenizer, uneven, padding):
    """32 rows of different lengths, not pre-padded: 32 x GA 1 == 8 x GA 4 == 1 x GA 32 (loss and weights)."""
    masking = (dict(padding="max_length") if padding == "max_length" else dict(train_on_padding=False))
    loss_big, weights_big = one_step(tmp_path / "a", tokenizer, uneven, per_device=32, max_length=640,
                                     trajectory_ratio=0.3, **masking)
    for per_device, accumulation, accepts_kwargs in ((8, 4, True), (8, 4, False), (1, 32, True)):
        loss, weights = one_step(tmp_path / "b", tokenizer, uneven, per_device=per_device, accumulation=accumulation,
                                 accepts_kwargs=accepts_kwargs, max_length=640, trajectory_ratio=0.3, **masking)
        assert loss == pytest.approx(loss_big, rel=1e-5), (per_device, accumulation)
        assert torch.allclose(weights, weights_big, atol=1e-6), (per_device, accumulation)
    # The batch search's split (room for 11 rows: 8 x GA 4) of global_batch_size 32 trains the same objective.
    loss, weights = one_step(tmp_path / "c", tokenizer, uneven, max_length=640, searched=(32, 11), trajectory_ratio=0.3,
                             **masking)
    assert loss == pytest.approx(loss_big, rel=1e-5) and torch.allclose(weights, weights_big, atol=1e-6)
    assert (weights_big - flat_weights(tiny_student(tokenizer, "llada", seed=1))).abs().max() > 1e-3


def out_of_memory_above(model: torch.nn.Module, limit: int) -> list[tuple[int, ...]]:
    """Make ``model``'s forward raise CUDA's out-of-memory error on batches of more than ``limit`` rows, as a card
    with room for ``limit`` does; returns the input shapes it was called with."""
    shapes = []

    def forward(module, args, kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        if shapes[-1][0] > limit:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {shapes[-1][0]} GiB.")

    model.register_forward_pre_hook(forward, with_kwargs=True)
    return shapes


@pytest.fixture
def no_collect(monkeypatch):
    """accelerate's batch search runs a full garbage collection at every out-of-memory step, which takes about 0.4 s
    in a process that has run the suite this far and tells these searches' logic nothing."""
    import accelerate.utils.memory

    monkeypatch.setattr(accelerate.utils.memory.gc, "collect", lambda *args: 0)


@pytest.mark.parametrize("processes", [1, 2, 4, 8, 32])
@pytest.mark.parametrize("fits_up_to", [1, 3, 8, 40])
def test_batch_search_picks_the_largest_fitting_split_of_the_global_batch(processes, fits_up_to, no_collect):
    from trims_hf.training.batch_search import largest_fitting_batch, rows_per_process

    def fits(batch: int) -> None:
        if batch > fits_up_to:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    rows = rows_per_process(32, processes)
    batch = largest_fitting_batch(fits, rows)
    assert batch == max(b for b in (1, 2, 4, 8, 16, 32) if b <= min(fits_up_to, rows))
    assert batch * (rows // batch) * processes == 32


def test_batch_search_errors(no_collect):
    from trims_hf.errors import InputError
    from trims_hf.training.batch_search import largest_fitting_batch, rows_per_process

    with pytest.raises(InputError, match="global_batch_size 32 does not split evenly over 3 processes"):
        rows_per_process(32, 3)
    with pytest.raises(InputError, match="global_batch_size with 2 GPUs in one process: launch one process per GPU"):
        rows_per_process(32, 1, 2)

    def never(batch: int) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    with pytest.raises(InputError, match="per-device batch 1 does not fit in memory"):
        largest_fitting_batch(never, 4)

    def broken(batch: int) -> None:
        raise RuntimeError("shape mismatch")  # not out of memory: not a reason to try a smaller batch

    with pytest.raises(RuntimeError, match="shape mismatch"):
        largest_fitting_batch(broken, 4)


@pytest.mark.parametrize("setting,message", [
    ({"per_device_train_batch_size": 4}, "chooses per_device_train_batch_size itself"),
    ({"gradient_accumulation_steps": 4}, "chooses gradient_accumulation_steps itself"),
    ({"per_device_train_batch_size": 8}, "chooses per_device_train_batch_size itself"),  # transformers' defaults,
    ({"gradient_accumulation_steps": 1}, "chooses gradient_accumulation_steps itself"),  # given: still not searched
    ({"auto_find_batch_size": True}, "with auto_find_batch_size"),
    ({"fsdp": "full_shard"}, "under FSDP or ZeRO-3"),
    ({"global_batch_size": 0}, "global_batch_size 0: must be at least 1"),
])
def test_a_searched_split_refuses_what_would_change_or_break_it(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        make_args(tmp_path, **({"global_batch_size": 32} | setting))
    make_args(tmp_path, **(setting | {"global_batch_size": None}))  # alone: valid


@pytest.mark.parametrize("checkpointing", [False, True])
def test_mdlm_trainer_searches_the_batch_at_max_length(tmp_path, tokenizer, checkpointing, no_collect):
    """MDLMConfig(global_batch_size=32): the probes run the student at max_length from 32 rows down (with the run's
    gradient checkpointing), and the Trainer is built with the largest batch that fit and the accumulation that keeps
    32 rows per step."""
    model = tiny_student(tokenizer).eval()  # as from_pretrained loads it: checkpointing runs in training mode only
    shapes = out_of_memory_above(model, 5)
    blocks = [m for m in model.modules() if type(m).__name__ in model._no_split_modules]
    seen = []
    for block in blocks:
        block.register_forward_pre_hook(lambda module, args: seen.append(
            (module.training, module.gradient_checkpointing and torch.is_grad_enabled())))
    trainer = MDLMTrainer(model, make_args(tmp_path, global_batch_size=32, max_length=96,
                                           activation_checkpointing=checkpointing), processing_class=tokenizer)
    assert model.is_activation_checkpointing == checkpointing
    assert seen and set(seen) == {(True, checkpointing)}  # every probe ran as Trainer.train will: checkpointed or not
    assert not model.training  # and the model is left in the mode it came in
    assert shapes == [(32, 96), (16, 96), (8, 96), (4, 96)]
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (4, 8)
    assert trainer._train_batch_size == 4 and trainer.get_total_train_batch_size(trainer.args) == 32
    assert all(p.grad is None for p in model.parameters())  # the probes leave no gradients behind


ZERO = {"plain": None, "zero2": {"stage": 2}, "zero0": {"stage": 0},
        "zero2-offload": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


@pytest.mark.parametrize("optim,per_element", [("adamw_torch", 8), ("sgd", 0), ("rmsprop", 4)])
@pytest.mark.parametrize("zero", ZERO.values(), ids=ZERO.keys())
def test_the_reserve_is_the_optimizers_states(tmp_path, monkeypatch, optim, per_element, zero):
    """The states the run's optimizer will keep, measured from the optimizer itself: per element of a trainable
    parameter AdamW two moments, RMSprop one, plain SGD none, each in the parameter's dtype; under DeepSpeed fp32
    states of fp32 master copies, which half-precision parameters add, split over the processes at ZeRO stage 1-2 (not
    at stage 0), and nothing on the device when the optimizer is offloaded to the host."""
    from types import SimpleNamespace

    from trims_hf.training import batch_search

    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Linear(30, 20).to(torch.bfloat16))
    model[0].weight.requires_grad_(False)  # frozen (a LoRA base's weights): no state
    fp32, bf16 = 30, 30 * 20 + 20
    args = TrainingArguments(output_dir=str(tmp_path), optim=optim, use_cpu=True, report_to="none")
    expected = per_element * fp32 + per_element // 2 * bf16
    if zero is not None:
        monkeypatch.setattr(args, "deepspeed_plugin", SimpleNamespace(deepspeed_config={"zero_optimization": zero}))
        monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: 4))
        expected = (per_element * (fp32 + bf16) + 4 * bf16) / (4 if zero["stage"] else 1)
        expected *= "offload_optimizer" not in zero
    reserve = batch_search.optimizer_state_bytes(model, args, batch_search.optimizer_spec(args))
    assert set(reserve) <= {torch.device("cpu")}
    assert sum(reserve.values()) == pytest.approx(expected, rel=1e-3, abs=1)


def test_the_trainers_own_optimizer_is_the_one_measured_and_held_during_the_probes(tmp_path, monkeypatch, tokenizer,
                                                                                 no_collect):
    """MDLMTrainer(optimizer_cls_and_kwargs=...) or (optimizers=(instance, None)) is what the Trainer will step, so
    its states are the reserve, not those of ``args.optim``; the reserve is held while every probe runs."""
    from trims_hf.training import batch_search

    holding, probed, reserves = [], [], []

    @contextlib.contextmanager
    def recorded(reserve):
        holding.append(reserve)
        yield
        holding.pop()

    monkeypatch.setattr(batch_search, "held", recorded)
    monkeypatch.setattr(batch_search, "probe_step", lambda *args: probed.append(list(holding)))
    for given in ("class", "instance"):
        model = tiny_student(tokenizer)
        trainable = sum(p.numel() for p in model.parameters())
        momentum = {"optimizer_cls_and_kwargs": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})} if given == "class" \
            else {"optimizers": (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), None)}
        MDLMTrainer(model, make_args(tmp_path, optim="adamw_torch", global_batch_size=8, max_length=32),
                    processing_class=tokenizer, **momentum)
        reserves.append(sum(probed[-1][0].values()))
        assert reserves[-1] == pytest.approx(4 * trainable, rel=1e-3)  # one fp32 momentum buffer, not AdamW's two
    assert not holding


def test_what_the_batch_search_cannot_measure_is_refused(tmp_path, monkeypatch, tokenizer):
    from types import SimpleNamespace

    from trims_hf.errors import InputError
    from trims_hf.training import batch_search

    with pytest.raises(ValueError, match="optim galore_adamw: its optimizer is built from the model"):
        make_args(tmp_path, optim="galore_adamw", global_batch_size=32)
    args = make_args(tmp_path, global_batch_size=8, max_length=32)
    def muon_factory():  # transformers calls a factory, then the result with the model
        raise AssertionError("not called")

    with pytest.raises(InputError, match="the optimizer factory muon_factory: the batch search cannot measure"):
        batch_search.optimizer_spec(args, (muon_factory, {}))
    monkeypatch.setattr(args, "deepspeed_plugin", SimpleNamespace(deepspeed_config={"optimizer": {"type": "Adam"}}))
    with pytest.raises(InputError, match="DeepSpeed config that builds its own optimizer"):
        batch_search.fit_global_batch(tiny_student(tokenizer), args, 8, 32)


def test_optimizer_states_that_do_not_fit_are_one_error(tmp_path, monkeypatch, tokenizer):
    """Out of memory while the reserve is allocated (the states alone do not fit beside the model) is one error line
    naming the states' size, not a traceback, and no probe runs."""
    from trims_hf.errors import InputError
    from trims_hf.training import batch_search

    def full(reserve):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB.")

    probed = []
    monkeypatch.setattr(batch_search, "held", full)
    monkeypatch.setattr(batch_search, "probe_step", lambda *args: probed.append(1))
    with pytest.raises(InputError, match=r"the optimizer's states \(0.00 GiB on cpu per process\) do not fit"):
        batch_search.fit_global_batch(tiny_student(tokenizer), make_args(tmp_path, optim="adamw_torch"), 8, 32)
    assert not probed


@dataclass
class RecordingCollator(TrimsDataCollator):
    """The trainer's collator, keeping every batch it produced, to recompute the logged statistics."""

    batches: list = field(default_factory=list)

    def __call__(self, features):
        batch = super().__call__(features)
        self.batches.append(batch)
        return batch


@pytest.mark.slow
def test_training_reduces_loss_and_logs_metrics(tmp_path, tokenizer, scored):
    model = tiny_student(tokenizer, "llada", hidden=64)
    args = make_args(tmp_path, max_steps=40, learning_rate=3e-3, optim="adamw_torch", logging_steps=10,
                     trajectory_ratio=0.3, max_length=512)
    collator = RecordingCollator(tokenizer, masking=args.masking(), max_length=args.max_length, seed=args.seed)
    trainer = MDLMTrainer(model, args, data_collator=collator, train_dataset=Dataset.from_list(scored),
                          eval_dataset=Dataset.from_list(scored[:16]), processing_class=tokenizer)
    before = trainer.evaluate()["eval_loss"]  # masks are a function of the rows: the same eval batches both times
    first = len(collator.batches)
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < 0.75 * before, (before, after)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    windows = [collator.batches[first + 10 * w:first + 10 * (w + 1)] for w in range(4)]  # GA 1: a batch per step
    assert len(logs) == 4
    for entry, window in zip(logs, windows):
        masked = torch.cat([b["masked"].sum(1) / (b["labels"] != -100).sum(1) for b in window])
        trajectory = torch.cat([b["is_trajectory"] for b in window]).float()
        assert entry["mask_ratio"] == pytest.approx(masked.mean().item(), rel=1e-5)
        assert entry["trajectory_share"] == pytest.approx(trajectory.mean().item(), rel=1e-5)
        assert "loss_standard" in entry
    assert any("loss_trajectory" in entry for entry in logs)
    shares = [entry["trajectory_share"] for entry in logs]
    assert 0.1 < sum(shares) / len(shares) < 0.5  # ratio 0.3 with 80 samples per log window


def test_plain_training_arguments_keep_score_columns(tmp_path, tokenizer, scored):
    """remove_unused_columns=True (the Trainer default) must not strip the collator's columns."""
    model = tiny_student(tokenizer, "llada")
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=2, report_to="none",
                             use_cpu=True, save_strategy="no", remove_unused_columns=True, disable_tqdm=True)
    collator = TrimsDataCollator(tokenizer)
    dataset = Dataset.from_list(scored).add_column("unrelated", list(range(len(scored))))
    trainer = MDLMTrainer(model, args, data_collator=collator, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 2


def test_evaluation_reports_loss_and_metrics(tmp_path, tokenizer, scored):
    model = tiny_student(tokenizer, "dream")
    trainer = MDLMTrainer(model, make_args(tmp_path, per_device_eval_batch_size=8), eval_dataset=Dataset.from_list(scored[:16]),
                          processing_class=tokenizer)
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] > 0 and 0 < metrics["eval_mask_ratio"] < 1
    trainer.data_collator.epoch = 5  # as during training: evaluation keeps its own, fixed masks
    assert trainer.evaluate()["eval_loss"] == pytest.approx(metrics["eval_loss"], rel=1e-6)
    assert trainer.data_collator.epoch == 5


def test_unprepared_model_is_rejected(tmp_path, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    plain = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(ValueError, match="prepare_student"):
        MDLMTrainer(plain, make_args(tmp_path), processing_class=tokenizer)


def test_sequence_mode_logs_per_sequence_losses(tmp_path, tokenizer, scored, prepared):
    model = tiny_student(tokenizer, "llada")
    trainer = MDLMTrainer(model, make_args(tmp_path, loss_normalization="sequence", trajectory_ratio=0.0),
                          processing_class=tokenizer)
    batch = trainer.data_collator(prepared[:4])
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch)
    model.train()
    metrics = trainer._pop_metrics("train")
    assert metrics["loss_standard"] == pytest.approx(loss.item(), rel=1e-5)  # all standard: same normaliser


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llada"])
def test_compiled_blocks_train_the_same_objective(tmp_path, tokenizer, prepared, kind, compile_without_codegen):
    """compile_blocks compiles every decoder block in place (adapters, hooks and parameters stay the model's own) and
    the loss and every LoRA gradient equal the eager ones to float rounding; a second batch shape still runs."""
    from peft import get_peft_model

    from trims_hf import lora_config

    grads = {}
    for compiled in (False, True):
        model = tiny_student(tokenizer, kind)
        model = get_peft_model(model, lora_config(model, lora_dropout=0.0))
        trainer = MDLMTrainer(model, make_args(tmp_path, compile_blocks=compiled), processing_class=tokenizer)
        blocks = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
        assert blocks and all((m._compiled_call_impl is not None) == compiled for m in blocks)
        batch = TrimsDataCollator(tokenizer, seed=0)(prepared[:4])
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        grads[compiled] = (loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad})
        trainer.compute_loss(model, TrimsDataCollator(tokenizer, seed=0)(prepared[:3])).backward()
    torch.testing.assert_close(grads[True][0], grads[False][0], rtol=1e-5, atol=1e-6)
    assert grads[True][1].keys() == grads[False][1].keys()
    for name, grad in grads[False][1].items():
        torch.testing.assert_close(grads[True][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_compile_blocks_names_a_model_without_blocks():
    from trims_hf.training.trainer import compile_blocks

    with pytest.raises(ValueError, match="compile_blocks: Linear names no decoder block"):
        compile_blocks(torch.nn.Linear(2, 2))


@pytest.mark.slow
@pytest.mark.filterwarnings("error::FutureWarning")  # checkpointing by transformers' current names
def test_compiled_blocks_train_as_eager_under_activation_checkpointing(tmp_path, tokenizer, prepared, compile_without_codegen):
    """Two optimizer steps of a LoRA student with gradient checkpointing: compiled blocks end at the eager run's
    weights (to float rounding), so the recipes may combine the two."""
    from torch._dynamo.utils import counters

    from trims_hf import lora_config
    from trims_hf.students import get_lora_model

    trained = {}
    for compiled in (False, True):
        model = tiny_student(tokenizer, "llada")
        model = get_lora_model(model, lora_config(model, lora_dropout=0.0))
        args = make_args(tmp_path / str(compiled), compile_blocks=compiled, activation_checkpointing=True, max_steps=2,
                         per_device_train_batch_size=4)
        torch._dynamo.reset()  # code compiled by an earlier test would be reused without counting a graph
        counters.clear()
        MDLMTrainer(model, args, train_dataset=Dataset.from_list(prepared[:8]), processing_class=tokenizer).train()
        blocks = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
        assert blocks and all((m._compiled_call_impl is not None) == compiled for m in blocks)
        assert (counters["stats"]["unique_graphs"] > 0) == compiled  # compiled code ran, not just a wrapper set
        assert all(m.gradient_checkpointing for m in blocks)
        trained[compiled] = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    assert trained[True].keys() == trained[False].keys()
    moved = 0
    for name, weight in trained[False].items():
        torch.testing.assert_close(trained[True][name], weight, rtol=1e-4, atol=1e-6, msg=name)
        moved += "lora_B" in name and bool(weight.abs().sum() > 0)  # B starts at 0: the steps trained it
    assert moved


def test_progress_bar_logs_numbers_as_numbers(tmp_path, tokenizer, scored):
    from transformers.trainer_callback import ProgressCallback

    from trims_hf.training.trainer import NumericProgressCallback

    trainer = MDLMTrainer(tiny_student(tokenizer), make_args(tmp_path, disable_tqdm=False),
                          train_dataset=Dataset.from_list(scored[:8]), processing_class=tokenizer)
    bars = [c for c in trainer.callback_handler.callbacks if isinstance(c, ProgressCallback)]
    assert [type(c) for c in bars] == [NumericProgressCallback]  # transformers' own one replaced, not doubled
    written = []
    bars[0].training_bar = type("Bar", (), {"write": lambda self, text: written.append(text)})()
    bars[0].on_log(trainer.args, trainer.state, trainer.control, logs={"loss": 2.44712, "epoch": 0.5, "total_flos": 9.0})
    assert written == ["{'loss': 2.447, 'epoch': 0.5}"]


@pytest.mark.parametrize("prepared_with, trained_with", [(4, 8), (8, 4), (8, 2)])
def test_rows_prepared_for_another_k_are_refused_before_training(scored, tokenizer, tmp_path, prepared_with,
                                                                 trained_with):
    """Prepared rows carry bucket ids cut for one K. Trained with a larger K, every cut point past the rows' last
    bucket would leave no future to hide (the sample masked at p_context only); with a smaller one, ids fall out of
    range. Both are refused when the trainer takes the rows, in the column's terms."""
    rows = prepare_dataset(Dataset.from_list(scored), tokenizer, buckets=BucketConfig(num_buckets=prepared_with))
    args = make_args(tmp_path, num_buckets=trained_with)
    with pytest.raises(SchemaError, match=rf"^column 'bucket_ids': the prepared rows' bucket ids reach "
                                          rf"{prepared_with - 1}, as rows prepared with num_buckets={prepared_with} do, "
                                          rf"but this run trains with num_buckets={trained_with}; "):
        MDLMTrainer.prepare_rows(rows, tokenizer, args.student_format(), args.masking(), args)
    same = make_args(tmp_path, num_buckets=prepared_with)
    assert MDLMTrainer.prepare_rows(rows, tokenizer, same.student_format(), same.masking(), same) is rows
    baseline = make_args(tmp_path, num_buckets=trained_with, trajectory_ratio=0.0)  # the baseline reads no bucket id
    assert MDLMTrainer.prepare_rows(rows, tokenizer, baseline.student_format(), baseline.masking(), baseline) is rows
    scattered = rows.shuffle(seed=0).select(range(8))  # an index mapping over the rows' table
    with pytest.raises(SchemaError, match="bucket ids reach"):
        MDLMTrainer.prepare_rows(scattered, tokenizer, args.student_format(), args.masking(), args)


def test_rows_are_held_to_the_collators_k_and_small_sets_are_not_judged(scored, tokenizer, tmp_path):
    """The collator given to the trainer trains the buckets (its masking, with plain TrainingArguments too); a set with
    too few bucket ids to show its last bucket is not judged by them."""
    rows = prepare_dataset(Dataset.from_list(scored), tokenizer, buckets=BucketConfig(num_buckets=4))
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, remove_unused_columns=False)

    def trainer(num_buckets: int, dataset: Dataset) -> MDLMTrainer:
        collator = TrimsDataCollator(tokenizer, masking=MaskingConfig(num_buckets=num_buckets), max_length=1024)
        return MDLMTrainer(model=tiny_student(tokenizer), args=args, data_collator=collator, train_dataset=dataset)

    assert trainer(4, rows).train_dataset is rows
    with pytest.raises(SchemaError, match=r"bucket ids reach 3, as rows prepared with num_buckets=4 do, but this run "
                                          r"trains with num_buckets=8; "):
        trainer(8, rows)
    one_row = Dataset.from_list(list(rows)[:1])  # its own table, of fewer ids than 16 per bucket
    assert len(one_row[0]["bucket_ids"]) < 16 * 8 and trainer(8, one_row).train_dataset is one_row
