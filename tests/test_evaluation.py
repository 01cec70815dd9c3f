"""evaluate_task on a tiny random student, exact counts on a scripted student, sweeps, table and frontier plot."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import SHARED, read_jsonl, tiny_student
from torch import nn
from transformers import PreTrainedConfig

from trims_hf import prepare_student
from trims_hf.evaluation import (
    EvalResult,
    cut_at_stop_strings,
    evaluate_task,
    format_table,
    plot_frontier,
    sweep,
)
from trims_hf.generation import DecodingConfig, TrajectoryRecorder
from trims_hf.tasks import CodeExecutionDisabled, GSM8KTask

GSM8K_TEST = SHARED / "data" / "gsm8k" / "test.jsonl"
STOP = "\n\nQuestion:"
GEN, BLOCK, CONFIDENCE = 256, 32, 0.95


class StopStringGSM8K(GSM8KTask):
    """GSM8K whose answers end at a stop string, as in few-shot prompts."""

    stop_strings = (STOP,)


class AnswerStudent(nn.Module):
    """A fake student that, for each question it finds in its input, commits scripted response ids then EOS.

    Every response position gets its scripted token with probability ``CONFIDENCE``, so under a threshold
    below it a block is decoded in one forward, and above it in one forward per position.
    """

    def __init__(self, tokenizer, answers: dict[str, list[int]]) -> None:
        super().__init__()
        self.config = PreTrainedConfig(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
        self.tokenizer, self.answers = tokenizer, answers
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the module a device
        prepare_student(self, "llada", tokenizer.mask_token_id)

    def forward(self, input_ids, attention_mask=None, logits_to_keep=slice(None), **kwargs):
        vocab = self.config.vocab_size
        logits = torch.full((*input_ids.shape, vocab), float(torch.log(torch.tensor((1 - CONFIDENCE) / (vocab - 1)))))
        for row, ids in enumerate(input_ids):
            prompt = self.tokenizer.decode(ids[:-GEN], skip_special_tokens=True)
            answer = next(a for question, a in self.answers.items() if question in prompt)
            script = answer + [self.tokenizer.eos_token_id] * (GEN - len(answer))
            positions = torch.arange(len(ids) - GEN, len(ids))
            logits[row, positions, torch.tensor(script)] = float(torch.log(torch.tensor(CONFIDENCE)))
        return SimpleNamespace(logits=logits[:, logits_to_keep])


@pytest.fixture(scope="module")
def gsm8k_test() -> list[dict]:
    return read_jsonl(GSM8K_TEST, 3)


@pytest.fixture(scope="module")
def scripted(tokenizer, gsm8k_test):
    """Answers: gold (correct), gold + stop string + a wrong tail (correct once cut), wrong number (incorrect)."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    gold = [row["answer"] for row in gsm8k_test]
    wrong = gold[2].rsplit("####", 1)[0] + "#### 12345"
    kept = [encode(gold[0]), encode(gold[1]), encode(wrong)]
    tails = [[], encode(STOP + " Tom has 3 apples. #### 99"), []]
    answers = {row["question"]: k + t for row, k, t in zip(gsm8k_test, kept, tails)}
    return SimpleNamespace(model=AnswerStudent(tokenizer, answers), kept=kept, full=[k + t for k, t in zip(kept, tails)],
                           texts=[gold[0], gold[1], wrong])


def run(scripted, tokenizer, **kwargs) -> EvalResult:
    options = dict(config=DecodingConfig(gen_length=GEN, block_length=BLOCK), limit=3, data_file=str(GSM8K_TEST),
                   progress=False) | kwargs
    return evaluate_task(scripted.model, tokenizer, StopStringGSM8K(), **options)


def test_scripted_student_exact_accuracy_and_tokens_per_step(scripted, tokenizer):
    result = run(scripted, tokenizer)
    assert result.accuracy == pytest.approx(2 / 3)
    assert [s.correct for s in result.samples] == [True, True, False]
    assert [s.completion for s in result.samples] == scripted.texts  # the tail after the stop string is cut
    # counted tokens: the scripted answer before EOS and before the stop string
    assert [s.generated_tokens for s in result.samples] == [len(ids) for ids in scripted.kept]
    # every answer is cut at a stop string before its EOS: the peers' non-EOS count is the same here
    assert [s.non_eos_tokens for s in result.samples] == [len(ids) for ids in scripted.kept]
    assert result.tokens_per_forward_non_eos == result.tokens_per_step and result.non_eos_tokens == result.generated_tokens
    # one forward per block up to the block holding the EOS (early stop skips the rest)
    nfe = [len(ids) // BLOCK + 1 for ids in scripted.full]
    assert [s.nfe for s in result.samples] == nfe and result.nfe == sum(nfe)
    expected = sum(len(ids) for ids in scripted.kept) / sum(nfe)
    assert result.tokens_per_step == pytest.approx(expected)
    assert result.tokens_per_step != pytest.approx(sum(len(k) / n for k, n in zip(scripted.kept, nfe)) / 3)
    assert result.early_stop is True and result.tokens_per_second > 0


def test_batching_and_early_stop_off(scripted, tokenizer):
    alone, batched = run(scripted, tokenizer), run(scripted, tokenizer, batch_size=2)
    assert [(s.generated_tokens, s.nfe, s.completion) for s in batched.samples] == \
        [(s.generated_tokens, s.nfe, s.completion) for s in alone.samples]
    no_stop = run(scripted, tokenizer, config=DecodingConfig(gen_length=GEN, block_length=BLOCK, early_stop=False))
    assert no_stop.early_stop is False and no_stop.nfe == 3 * (GEN // BLOCK)
    assert no_stop.generated_tokens == alone.generated_tokens  # the EOS tail is never counted


def test_sweep_over_thresholds(scripted, tokenizer):
    loose, strict = sweep(scripted.model, tokenizer, StopStringGSM8K(), [0.5, 0.99],
                          DecodingConfig(gen_length=GEN, block_length=BLOCK), limit=3, data_file=str(GSM8K_TEST),
                          progress=False)
    assert (loose.setting, strict.setting) == ("threshold 0.5", "threshold 0.99")
    assert loose.tokens_per_step == pytest.approx(run(scripted, tokenizer).tokens_per_step)
    # above the model's confidence: one position per forward, up to the end of the block holding the EOS
    assert strict.nfe == sum((len(ids) // BLOCK + 1) * BLOCK for ids in scripted.full)
    assert strict.accuracy == loose.accuracy


def test_tiny_random_student_on_gsm8k(tokenizer):
    model = tiny_student(tokenizer).eval()
    trajectories = TrajectoryRecorder()
    result = evaluate_task(model, tokenizer, "gsm8k", DecodingConfig(gen_length=32, block_length=16), limit=3,
                           data_file=str(GSM8K_TEST), progress=False, hooks=[trajectories], model_name="tiny")
    assert result.num_samples == 3 and [s.prompt_id for s in result.samples] == ["0", "1", "2"]
    task, examples = GSM8KTask(), GSM8KTask().load(str(GSM8K_TEST), limit=3)
    regraded = [task.grade(example, sample.completion)["correct"] for example, sample in zip(examples, result.samples)]
    assert [sample.correct for sample in result.samples] == regraded
    assert result.accuracy == sum(regraded) / 3
    assert result.nfe == sum(s.nfe for s in result.samples) and all(1 <= s.nfe <= 32 for s in result.samples)
    assert result.generated_tokens == sum(s.generated_tokens for s in result.samples)
    assert result.tokens_per_step == pytest.approx(result.generated_tokens / result.nfe)
    assert result.prompt_format["template"] == "chat_template" and result.prompt_format["shots"] == 0
    assert result.decoding["gen_length"] == 32 and result.decoding["strategy"] == "threshold"
    assert [t.sample_id for t in trajectories.trajectories] == ["0", "1", "2"]
    restored = json.loads(json.dumps(result.to_dict()))
    assert restored["tokens_per_step"] == result.tokens_per_step and len(restored["samples"]) == 3
    assert set(restored["samples"][0]) >= {"prompt_id", "completion", "extracted", "correct", "generated_tokens", "nfe"}


def test_code_task_needs_execution_opt_in(tokenizer):
    with pytest.raises(CodeExecutionDisabled, match="execute_code=True"):
        evaluate_task(tiny_student(tokenizer), tokenizer, "humaneval", limit=1, progress=False)


def test_cut_at_stop_strings():
    assert cut_at_stop_strings("a [DONE] b STOP c", ("STOP", "[DONE]")) == "a "
    assert cut_at_stop_strings("no stop", ("STOP",)) == "no stop"


def result(model: str, task: str, threshold: float, accuracy: float, tokens_per_step: float) -> EvalResult:
    return EvalResult(model=model, task=task, accuracy=accuracy, tokens_per_step=tokens_per_step,
                      tokens_per_forward_non_eos=tokens_per_step, tokens_per_second=10.0, nfe=10, generated_tokens=10,
                      non_eos_tokens=10, num_samples=1, decode_time_s=1.0, wall_time_s=1.0, early_stop=True,
                      prompt_format={}, decoding={"strategy": "threshold", "threshold": threshold})


def test_table_and_frontier_plot(tmp_path):
    results = [result("llada", "gsm8k", 0.9, 0.726, 2.771), result("llada", "math500", 0.9, 0.322, 1.5),
               result("llada", "gsm8k", 0.5, 0.6, 5.0), result("trims", "gsm8k", 0.9, 0.749, 6.26)]
    table = format_table(results).splitlines()
    assert table[0] == "| Model | Setting | gsm8k Acc | gsm8k Tokens/step | math500 Acc | math500 Tokens/step |"
    assert table[2] == "| llada | threshold 0.9 | 72.6 | 2.77 | 32.2 | 1.50 |"
    assert table[4] == "| trims | threshold 0.9 | 74.9 | 6.26 | - | - |"
    assert "TPS" not in "\n".join(table) and "early stop: on" in table[-1]
    path = tmp_path / "frontier.png"
    figure = plot_frontier(results, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and len(figure.axes) == 2
