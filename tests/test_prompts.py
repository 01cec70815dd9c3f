"""One prompt rendering: teacher scoring, data preparation, decoding and evaluation feed identical prompt ids."""

from __future__ import annotations

import copy
import re

import pytest

from trims_hf import PromptFormat, StudentFormat, evaluate_task
from trims_hf.data.preparation import tokenize_example
from trims_hf.data.teacher import encode_row
from trims_hf.evaluation.tasks import Example, Task
from trims_hf.generation import decoding
from trims_hf.prompts import check_system_prompt, prompt_token_ids, render_prompt
from trims_hf.settings import ScoringOptions


class _Captured(Exception):
    """Raised by the stand-in decoder once it has seen the prompt ids."""


class OneRowTask(Task):
    """A task whose single example's prompt is the training row's prompt."""

    name, hub_id = "one-row", "none"

    def __init__(self, prompt):
        self.prompt_value = prompt

    def load(self, data_file=None, limit=None, split=None):
        return [Example("0", {})]

    def _to_example(self, row, index, source):
        raise NotImplementedError

    def messages(self, example):
        return [{"role": "user", "content": self.prompt_value}] if isinstance(self.prompt_value, str) else self.prompt_value

    def prompt_format(self, tokenizer=None):
        return {"template": self.template_name(tokenizer)}

    def reference(self, example):
        return None

    def extract(self, completion_text):
        return completion_text

    def grade(self, example, completion_text, execute_code=False):
        return {"correct": False, "extracted": None, "error": None}


def decoded_prompt_ids(monkeypatch, run) -> list[list[int]]:
    """The real (left-unpadded) prompt ids the decoder receives when ``run()`` decodes."""
    seen = []

    def fake_generate(model, input_ids, attention_mask, *args, **kwargs):
        seen.extend(row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask))
        raise _Captured

    monkeypatch.setattr(decoding, "generate", fake_generate)
    with pytest.raises(_Captured):
        run()
    return seen


class _Model:
    config = None

    def state_dict(self):
        return {}

    def parameters(self):
        import torch

        yield torch.zeros(1)


@pytest.fixture(params=["chat", "plain"])
def student_tokenizer(request, tokenizer):
    if request.param == "chat":
        assert tokenizer.chat_template
        return tokenizer
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    return plain


@pytest.mark.parametrize("prompt_kind", ["text", "messages"])
def test_scoring_preparation_decoding_and_evaluation_agree(monkeypatch, student_tokenizer, gsm8k_rows, prompt_kind):
    row = gsm8k_rows[0]
    prompt = row["prompt"] if prompt_kind == "text" else [
        {"role": "user", "content": "Answer briefly."}, {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": row["prompt"]}]
    tok = student_tokenizer
    expected = prompt_token_ids(tok, prompt, PromptFormat())
    encoded = encode_row({"prompt": prompt, "completion": row["completion"]}, 0, tok, ScoringOptions(), 10_000)
    scoring = list(encoded.input_ids[: encoded.prompt_length])
    example = tokenize_example(tok, prompt, row["completion"], StudentFormat(max_length=10_000))
    preparation = example.input_ids[: example.prompt_length]
    monkeypatch.setattr(decoding, "_eos_ids", lambda model: [tok.eos_token_id])
    decoded = decoded_prompt_ids(monkeypatch, lambda: decoding.generate_text(_Model(), tok, [prompt]))
    evaluated = decoded_prompt_ids(monkeypatch, lambda: evaluate_task(_Model(), tok, OneRowTask(prompt), progress=False))
    assert scoring == preparation == decoded[0] == evaluated[0] == expected
    if tok.chat_template is None:  # plain: the text with the tokenizer's own special tokens, messages joined by a blank line
        text = prompt if isinstance(prompt, str) else "\n\n".join(m["content"] for m in prompt)
        assert expected == tok(text)["input_ids"]
    else:
        assert expected == tok(tok.apply_chat_template(
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt,
            add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]


def test_system_prompt_and_format_strings(tokenizer):
    with_system = render_prompt(tokenizer, "Hi", PromptFormat(system_prompt="Be brief."))[0]
    assert "Be brief." in with_system and with_system.index("Be brief.") < with_system.index("Hi")
    assert render_prompt(tokenizer, "Hi", PromptFormat("Q: {prompt}\nA:")) == ("Q: Hi\nA:", True)
    with pytest.raises(ValueError, match="needs a text prompt"):
        render_prompt(tokenizer, [{"role": "user", "content": "Hi"}], PromptFormat("Q: {prompt}"))
    for nonsense in ("nonsense", 5, None):
        with pytest.raises(ValueError, match=rf"^prompt_format must be one of .*, got {nonsense!r}\.$"):
            StudentFormat(prompt_format=nonsense)


@pytest.mark.parametrize("cls", [PromptFormat, StudentFormat, ScoringOptions])
@pytest.mark.parametrize("prompt_format", ["plain", "verbatim", "Q: {prompt}"])
def test_a_system_prompt_needs_the_chat_template(cls, prompt_format):
    """Every other format drops the system prompt, while the records (data card, model card) would still name it."""
    with pytest.raises(ValueError, match=rf"^system_prompt goes into the chat template, and prompt_format="
                                         rf"{re.escape(repr(prompt_format))} renders none; drop system_prompt"):
        cls(prompt_format, system_prompt="Be brief.")


def test_a_system_prompt_needs_a_tokenizer_with_a_chat_template(tokenizer):
    """chat_template falls back to plain text for a tokenizer without one, which would drop the system prompt."""
    fmt = PromptFormat(system_prompt="Be brief.")
    check_system_prompt(tokenizer, fmt)  # the test tokenizer has a chat template
    bare = copy.copy(tokenizer)
    bare.chat_template = None
    check_system_prompt(bare, PromptFormat())
    with pytest.raises(ValueError, match="^system_prompt goes into the chat template, and the tokenizer has none"):
        check_system_prompt(bare, fmt)
