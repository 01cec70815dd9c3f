"""Tiny random causal-LM teachers for scoring tests, sized for a test tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase


def make_teacher(tokenizer: PreTrainedTokenizerBase, seed: int = 0, hidden: int = 64, context: int = 2048) -> LlamaForCausalLM:
    """A random 2-layer Llama whose vocabulary is the tokenizer's."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval()


def save_teacher(tokenizer: PreTrainedTokenizerBase, folder: Path, context: int = 2048) -> Path:
    """A teacher folder loadable with ``from_pretrained`` (what ``--teacher PATH`` takes)."""
    make_teacher(tokenizer, context=context).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
