"""A study's own pretrained model when it has none (``trims demo``'s; a smoke run's stand-in): a word-level tokenizer
built over the study's texts, a tiny causal Llama, and its autoregressive training on the completions.

Why built in code: the demo runs offline (no Hub). Why the tokenizer's shape: numbers are split into single digits
(so a computed result is several uncertain tokens, as in real tokenizers, and copied operands are predictable digit by
digit); a word carries its leading space (``▁buys``) so text decodes back exactly and offsets cover every character,
which the scorer's character spans need; the vocabulary is tiny, so the models spend their capacity on the task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    DataCollatorForSeq2Seq,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

from ..data.preparation import tokenize_example
from ..training.trainer import with_numeric_logs
from .protocol import training_arguments

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


def tiny_llama(tokenizer: PreTrainedTokenizerBase, hidden_size: int, num_layers: int, num_heads: int,
               max_length: int, seed: int) -> LlamaForCausalLM:
    """A small Llama (rotary positions, like LLaDA): a teacher as is, a student once made bidirectional."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=2 * max_length, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def train_causal_lm(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[Mapping[str, str]],
                    args: TrainingArguments) -> PreTrainedModel:
    """Autoregressive SFT on ``prompt``/``completion`` rows, prompts rendered by the library's one renderer.

    The loss covers the completion and its end-of-response tokens only: the teacher models p(y | x), which is what
    its NLL scores measure. DataCollatorForSeq2Seq pads precomputed labels with -100 and ids with the pad token.
    """
    examples = [tokenize_example(tokenizer, row["prompt"], row["completion"]) for row in rows]
    prepared = Dataset.from_list([{"input_ids": e.input_ids,
                                   "labels": [-100] * e.prompt_length + list(e.input_ids[e.prompt_length :])}
                                  for e in examples])
    trainer = Trainer(model=model, args=args, train_dataset=prepared, data_collator=DataCollatorForSeq2Seq(tokenizer))
    with_numeric_logs(trainer).train()
    return model.eval()


def pretrain_tiny_llama(folder: Path, tokenizer: PreTrainedTokenizerBase, rows: Sequence[Mapping[str, str]],
                        sizes: tuple[int, int, int], max_length: int, steps: int, lr: float, batch_size: int,
                        seed: int, work: Path) -> None:
    """A tiny Llama of ``sizes`` (hidden, layers, heads) trained autoregressively on ``rows`` and saved with
    ``tokenizer`` into ``folder``: the pretrained model of a study that has none (the demo's; a smoke run's)."""
    model = tiny_llama(tokenizer, *sizes, max_length, seed=seed)
    train_causal_lm(model, tokenizer, rows, training_arguments(TrainingArguments, work, steps, lr, batch_size, seed))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
