"""One rendering of a prompt into tokens, shared by teacher scoring, data preparation, decoding and evaluation.

A prompt is a string or a list of chat messages. A mismatch between the prompt a student was trained on
and the one it is evaluated with silently costs accuracy, so every component calls :func:`prompt_token_ids`.
Likewise the tokens that end a response: training appends :func:`end_of_response_ids` after every completion
and decoding stops at the same ids, so a student stops where it learned to.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError

from .errors import InputError
from .settings import PromptFormat, response_tokens

Prompt = str | Sequence[dict[str, str]]


def join_messages(messages: Sequence[dict[str, str]]) -> str:
    """Chat messages as one text for a model without a chat template: contents separated by a blank line."""
    return "\n\n".join(m["content"] for m in messages)


def uses_chat_template(tokenizer: Any, fmt: PromptFormat) -> bool:
    """Whether ``fmt`` renders with the tokenizer's chat template (asked for, and the tokenizer has one)."""
    return fmt.prompt_format == "chat_template" and bool(getattr(tokenizer, "chat_template", None))


def resolved_format(tokenizer: Any, fmt: PromptFormat) -> str:
    """The format that really applies: ``chat_template`` falls back to ``plain`` for a tokenizer without one."""
    if fmt.prompt_format == "chat_template" and not uses_chat_template(tokenizer, fmt):
        return "plain"
    return fmt.prompt_format


def check_system_prompt(tokenizer: Any, fmt: PromptFormat) -> None:
    """A system prompt goes into the chat template (:class:`~trims_hf.settings.PromptFormat` refuses it with another
    format); ``chat_template`` with a tokenizer that has none renders plain, which would drop it silently."""
    if fmt.system_prompt is not None and not uses_chat_template(tokenizer, fmt):
        raise InputError("system_prompt goes into the chat template, and the tokenizer has none (prompt_format="
                         f"{fmt.prompt_format!r} renders plain text with it); drop system_prompt.")


def _messages(prompt: Prompt, fmt: PromptFormat) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if fmt.system_prompt and (not messages or messages[0].get("role") != "system"):
        messages = [{"role": "system", "content": fmt.system_prompt}, *messages]
    return messages


def render_prompt(tokenizer: Any, prompt: Prompt, fmt: PromptFormat) -> tuple[str, bool]:
    """``(text, add_special_tokens)``: the prompt text and whether the tokenizer adds its special tokens.

    A chat template renders any BOS text itself (and the generation prompt); the plain and format-string
    forms get the tokenizer's own special tokens, as a plain LM would see them.
    """
    if uses_chat_template(tokenizer, fmt):
        return tokenizer.apply_chat_template(_messages(prompt, fmt), add_generation_prompt=True, tokenize=False), False
    if fmt.prompt_format in ("plain", "chat_template"):  # chat_template lands here for a tokenizer without one
        return (prompt if isinstance(prompt, str) else join_messages(prompt)), True
    if not isinstance(prompt, str):
        raise ValueError(f"prompt_format {fmt.prompt_format!r} needs a text prompt, not chat messages.")
    if fmt.prompt_format == "verbatim":
        return prompt, False
    return fmt.prompt_format.replace("{prompt}", prompt), True


def prompt_token_ids(tokenizer: Any, prompt: Prompt, fmt: PromptFormat) -> list[int]:
    """The prompt's token ids exactly as every trims_hf component feeds them to a model."""
    text, special = render_prompt(tokenizer, prompt, fmt)
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def prompt_template(tokenizer: Any, fmt: PromptFormat) -> str:
    """The rendered prompt with a ``{prompt}`` placeholder, for data set and model cards."""
    return render_prompt(tokenizer, "{prompt}", fmt)[0]


_RESPONSE_MARKER = "TRIMSRESPONSEMARKER"


def end_of_turn_token(tokenizer: Any) -> str | None:
    """The special token the tokenizer's chat template closes an assistant turn with (None without one)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    turn = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _RESPONSE_MARKER}]
    try:
        rendered = tokenizer.apply_chat_template(turn, tokenize=False)
    except (TemplateError, ValueError):  # a template that refuses an assistant turn (raise_exception) or its roles
        return None
    after = rendered[rendered.find(_RESPONSE_MARKER) + len(_RESPONSE_MARKER):] if _RESPONSE_MARKER in rendered else ""
    ids = tokenizer(after.lstrip(), add_special_tokens=False)["input_ids"] if after.strip() else []
    token = tokenizer.convert_ids_to_tokens(ids[0]) if ids else None
    special = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
    return token if token in special else None


def end_of_response_ids(tokenizer: Any, end_of_response: str | Sequence[str] | None) -> list[int]:
    """Ids that end a response (:attr:`~trims_hf.settings.ResponseFormat.end_of_response`): the given tokens (one
    string is one token), each a single token of the vocabulary, or by default the chat template's end of turn
    followed by the EOS token."""
    tokens = response_tokens(end_of_response) if end_of_response is not None else list(
        dict.fromkeys(t for t in (end_of_turn_token(tokenizer), tokenizer.eos_token) if t is not None))
    ids = []
    for token in tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"End-of-response token {token!r} is not a single token of the student tokenizer.")
        if token_id == getattr(tokenizer, "mask_token_id", None):
            raise ValueError(f"End-of-response token {token!r} is the mask token: a response ends in a token the "
                             "student writes, and every undecoded position holds the mask.")
        ids.append(int(token_id))
    return ids


_WRITTEN_LIST = re.compile(r"\[.*['\",].*\]")  # ["<eos>"] or [a, b]: a YAML or JSON list typed as one value


def check_end_of_response(tokenizer: Any, end_of_response: str | Sequence[str] | None, label: str,
                          flag: str | None = None) -> None:
    """A command's check of its end-of-response setting against the student tokenizer, before any model loads:
    an :class:`~trims_hf.errors.InputError` naming ``label`` (the flag or recipe key as the user typed it); ``flag``, the
    command-line flag that sets it, is named when a value reads as a list written out, one value instead of several."""
    try:
        end_of_response_ids(tokenizer, end_of_response)
    except ValueError as error:
        written = flag and any(_WRITTEN_LIST.fullmatch(token) for token in response_tokens(end_of_response) or ())
        hint = f"; on the command line a list is its items apart ({flag} <eos> <|endoftext|>)" if written else ""
        raise InputError(f"{label}: {str(error).removesuffix('.')}{hint}.") from None
