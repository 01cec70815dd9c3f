"""Decode-and-grade during training: accuracy and tokens per step on a small task subset at every evaluation.

The metrics go through ``Trainer.log``, the only path that reaches W&B / TensorBoard (a callback editing
``logs`` in ``on_log`` runs after the trackers), so the callback needs the trainer: build it with
``trainer=`` or call :meth:`DecodeEvalCallback.attach`.

Distributed runs: every rank decodes the same subset with greedy decoding on the same weights. Wall time
equals rank-0-only decoding (the other ranks would wait for it anyway), no collective is needed, every
rank holds the same metrics (so ``metric_for_best_model="eval_gsm8k_accuracy"`` works), and trackers still
report only from rank 0. Not meant for ZeRO-3 / FSDP sharded weights.
"""

from __future__ import annotations

from typing import Any

from transformers import (
    PreTrainedTokenizerBase,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from ..evaluation.evaluate import evaluate_task, load_examples, longest_prompt_past
from ..evaluation.tasks import Task, get_task
from ..generation import DecodingConfig
from ..students.registry import model_positions


class DecodeEvalCallback(TrainerCallback):
    """Logs ``{prefix}_{task}_accuracy`` (a fraction, 0-1), ``_num_samples`` (its n), ``_tokens_per_step``,
    ``_tokens_per_second`` and ``_nfe`` at each evaluation.

    The examples are read once, at construction, so a wrong file or column fails before training starts. The
    metrics are also added to the dict ``Trainer.evaluate`` returns, so they can select the best model.
    """

    def __init__(
        self,
        task: Task | str,
        tokenizer: PreTrainedTokenizerBase,
        config: DecodingConfig | None = None,
        limit: int = 8,
        data_file: str | None = None,
        execute_code: bool = False,
        batch_size: int = 1,
        prefix: str = "eval",
        trainer: Trainer | None = None,
    ) -> None:
        self.task = get_task(task) if isinstance(task, str) else task
        self.examples = load_examples(self.task, data_file, limit, execute_code)
        self.tokenizer = tokenizer
        self.config = config or DecodingConfig()
        self.execute_code, self.batch_size = execute_code, batch_size
        self.prefix = prefix
        self.trainer: Trainer | None = None
        if trainer is not None:
            self.attach(trainer)

    def attach(self, trainer: Trainer) -> DecodeEvalCallback:
        """Register with ``trainer`` and keep a handle to log through it; refuses, before training starts, a decoder
        whose ``gen_length`` after the longest prompt would run past the model's positions."""
        if problem := longest_prompt_past(model_positions(trainer.model), self.task, self.examples, self.tokenizer,
                                          self.config.gen_length):
            raise ValueError(f"DecodeEvalCallback {self.task.name}: {problem}; decode fewer tokens (its config's "
                             "gen_length).")
        self.trainer = trainer
        trainer.add_callback(self)
        return self

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        metrics: dict[str, float] | None = None, **kwargs: Any,
    ) -> None:
        if self.trainer is None:
            raise RuntimeError(
                "DecodeEvalCallback needs its trainer: pass trainer=... or call callback.attach(trainer)."
            )
        # Through DDP/DeepSpeed wrappers to the module itself; a PeftModel stays wrapped so the adapter decodes.
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        was_training = model.training
        model.eval()
        try:
            result = evaluate_task(
                model, self.tokenizer, self.task, self.config, examples=self.examples, execute_code=self.execute_code,
                batch_size=self.batch_size, progress=False,
            )
            name = f"{self.prefix}_{self.task.name}"
            values = {
                f"{name}_accuracy": result.accuracy,
                f"{name}_num_samples": float(result.num_samples),
                f"{name}_tokens_per_step": result.tokens_per_step,
                f"{name}_tokens_per_second": result.tokens_per_second,
                f"{name}_nfe": float(result.nfe),
            }
            if metrics is not None:
                metrics.update(values)
            # Logged while the model is in eval mode: MDLMTrainer.log then leaves pending training statistics alone.
            self.trainer.log(dict(values))
        finally:
            model.train(was_training)
