"""The demo's word-level tokenizer, built in code from the demo's own texts (the Hub is unreachable).

Why this shape: numbers are split into single digits (so a computed result is several uncertain tokens,
as in real tokenizers, and copied operands are predictable digit by digit); a word carries its leading
space (``▁buys``) so text decodes back exactly and offsets cover every character, which the scorer's
character spans need; the vocabulary is tiny, so the models spend their capacity on the task.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<eos>", "<pad>", "<mask>", "<unk>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# A digit or a punctuation mark, each with its optional leading space, is a token of its own.
_PIECES = Regex(r"▁?(?:\d|[^\w▁])")


def build_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over ``texts`` (digits and punctuation single, newlines kept) with a chat template."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
        pre_tokenizers.Split(_PIECES, behavior="isolated"),
    ])
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    chat_texts = [CHAT_TEMPLATE.replace("{{ message['role'] }}", role) for role in ("user", "assistant")]
    trainer = trainers.WordLevelTrainer(special_tokens=list(SPECIAL_TOKENS), min_frequency=1)
    tokenizer.train_from_iterator([*texts, *chat_texts, "0 1 2 3 4 5 6 7 8 9 0123456789"], trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<pad>",
                                      mask_token="<mask>", unk_token="<unk>")
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped
