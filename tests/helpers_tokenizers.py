"""Tiny offline tokenizers for tests: the Hub is unreachable, so tests train one from a few lines."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<eos>", "<pad>", "<mask>")

# Role headers are plain text (not special tokens) so they tokenise like any other prompt text.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def make_tokenizer(texts: Iterable[str], vocab_size: int = 400, with_chat_template: bool = True) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts``.

    Byte-level pre-tokenisation keeps every character encodable and gives character offsets for
    ``return_offsets_mapping`` (a token's span includes its leading space, as in GPT-2 / Qwen).
    ``vocab_size`` must exceed the 256 byte symbols plus the special tokens.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(list(texts), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<pad>", mask_token="<mask>")
    if with_chat_template:
        wrapped.chat_template = CHAT_TEMPLATE
    return wrapped
