"""DecodeEvalCallback: decode metrics reach the Trainer's log (and so the trackers), model mode is restored."""

from __future__ import annotations

import pytest
from conftest import DATA, synthetic_scored_rows, tiny_student
from datasets import Dataset
from peft import get_peft_model
from transformers import TrainerCallback

from trims_hf import MDLMConfig, MDLMTrainer, evaluate_task, lora_config
from trims_hf.evaluation.tasks import TaskDataError
from trims_hf.generation import DecodingConfig
from trims_hf.training.callbacks import DecodeEvalCallback

GSM8K_TEST = str(DATA / "gsm8k" / "test.jsonl")
NAMES = ("eval_gsm8k_accuracy", "eval_gsm8k_num_samples", "eval_gsm8k_tokens_per_step", "eval_gsm8k_tokens_per_second",
         "eval_gsm8k_nfe")


class TrackerSpy(TrainerCallback):
    """Stands in for W&B / TensorBoard, which also only see what reaches ``on_log``."""

    def __init__(self) -> None:
        self.logged: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logged.append(dict(logs))


def make_trainer(tmp_path, tokenizer, gsm8k_rows, model) -> MDLMTrainer:
    scored = synthetic_scored_rows(gsm8k_rows[:8], tokenizer)
    args = MDLMConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=4,
                      max_steps=2, eval_strategy="steps", eval_steps=1, logging_steps=1, save_strategy="no",
                      report_to="none", use_cpu=True, disable_tqdm=True, learning_rate=1e-3)
    return MDLMTrainer(model, args, train_dataset=Dataset.from_list(scored), eval_dataset=Dataset.from_list(scored[:4]),
                       processing_class=tokenizer)


def callback(tokenizer, **kwargs) -> DecodeEvalCallback:
    return DecodeEvalCallback("gsm8k", tokenizer, DecodingConfig(gen_length=16, block_length=16), limit=2,
                              data_file=GSM8K_TEST, **kwargs)


@pytest.mark.slow
def test_metrics_logged_through_trainer_for_peft_student(tmp_path, tokenizer, gsm8k_rows):
    student = tiny_student(tokenizer)
    model = get_peft_model(student, lora_config(student, r=4))
    trainer = make_trainer(tmp_path, tokenizer, gsm8k_rows, model)
    spy = TrackerSpy()
    trainer.add_callback(spy)
    callback(tokenizer, trainer=trainer)
    trainer.train()
    decoded = [entry for entry in trainer.state.log_history if "eval_gsm8k_accuracy" in entry]
    assert [entry["step"] for entry in decoded] == [1, 2]
    for entry in decoded:
        assert set(NAMES) <= set(entry) and entry["eval_gsm8k_num_samples"] == 2
        assert entry["eval_gsm8k_tokens_per_step"] > 0 and entry["eval_gsm8k_nfe"] >= 2
    # The last decode ran on the final weights: decoding them directly gives the logged numbers.
    direct = evaluate_task(model.eval(), tokenizer, "gsm8k", DecodingConfig(gen_length=16, block_length=16), limit=2,
                           data_file=GSM8K_TEST, progress=False)
    assert decoded[-1]["eval_gsm8k_accuracy"] == direct.accuracy
    assert decoded[-1]["eval_gsm8k_tokens_per_step"] == pytest.approx(direct.tokens_per_step)
    assert decoded[-1]["eval_gsm8k_nfe"] == direct.nfe
    assert sum("eval_gsm8k_tokens_per_step" in logs for logs in spy.logged) == 2
    assert "eval_gsm8k_accuracy" in trainer.evaluate()  # usable as metric_for_best_model


def test_decodes_in_eval_mode_and_restores_training_mode(tmp_path, tokenizer, gsm8k_rows):
    model = tiny_student(tokenizer)
    trainer = make_trainer(tmp_path, tokenizer, gsm8k_rows, model)
    hook = callback(tokenizer).attach(trainer)
    modes: list[bool] = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    model.train()
    metrics: dict[str, float] = {}
    hook.on_evaluate(trainer.args, trainer.state, trainer.control, metrics=metrics)
    assert modes and not any(modes) and model.training
    assert set(NAMES) <= set(metrics) and trainer.state.log_history[-1]["eval_gsm8k_nfe"] == metrics["eval_gsm8k_nfe"]


def test_needs_its_trainer(tmp_path, tokenizer, gsm8k_rows):
    trainer = make_trainer(tmp_path, tokenizer, gsm8k_rows, tiny_student(tokenizer))
    orphan = callback(tokenizer)
    trainer.add_callback(orphan)
    with pytest.raises(RuntimeError, match="attach"):
        trainer.evaluate()


def test_bad_task_data_fails_at_construction(tmp_path, tokenizer):
    """The examples are read once, when the callback is built: a wrong file fails before training starts."""
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"problem": "1 + 1?", "answer": "2"}\n')
    with pytest.raises(TaskDataError, match="row 0 has no field 'question'"):
        DecodeEvalCallback("gsm8k", tokenizer, limit=2, data_file=str(wrong))


def test_a_decoder_past_the_models_positions_is_refused_when_attached(tmp_path, tokenizer, gsm8k_rows):
    """Before training starts, not at the first evaluation: the longest prompt plus gen_length must fit."""
    model = tiny_student(tokenizer)
    trainer = make_trainer(tmp_path, tokenizer, gsm8k_rows, model)
    positions = model.config.max_position_embeddings
    too_long = DecodeEvalCallback("gsm8k", tokenizer, DecodingConfig(gen_length=positions, block_length=positions),
                                  limit=2, data_file=GSM8K_TEST)
    with pytest.raises(ValueError, match=rf"^DecodeEvalCallback gsm8k: problem \d: gen_length={positions} after a prompt "
                                         rf"of \d+ tokens reaches position \d+, past the model's max_position_embeddings"
                                         rf"={positions}; decode fewer tokens"):
        too_long.attach(trainer)
    assert too_long not in trainer.callback_handler.callbacks
