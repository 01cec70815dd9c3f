"""Shared test fixtures: paths to ../shared, a tiny tokenizer, tiny students built in code."""

from __future__ import annotations

import json
import os
from pathlib import Path

from trims_hf.determinism import PINNED_ENVIRONMENT

os.environ.update(PINNED_ENVIRONMENT)  # before torch loads: the suite computes on the demo's code paths on any CPU

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers_tokenizers import make_tokenizer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from trims_hf import prepare_student  # noqa: E402

SHARED = Path(os.environ.get("TRIMS_SHARED") or Path(__file__).resolve().parents[2] / "shared")
"""The shared data and fixtures beside the repository; TRIMS_SHARED names another copy (a GPU machine gets one
carried inside the checkout, since only the checkout travels there)."""
GSM8K_TRAIN = SHARED / "data" / "gsm8k" / "train.jsonl"


@pytest.fixture(scope="session")
def original_checkpoint(tmp_path_factory):
    """``kind`` -> a tiny checkpoint in that family's original layout, with ``parity.safetensors``: LLaDA and Dream from
    ../shared/fixtures (logits of the original code), LLaDA-MoE and LLaDA 2.x written by the test (logits of the reference)."""
    built = {}

    def folder(kind: str) -> Path:
        if kind in ("llada_moe", "llada2"):
            from helpers_students import write_llada2_checkpoint, write_llada_moe_checkpoint

            write = write_llada_moe_checkpoint if kind == "llada_moe" else write_llada2_checkpoint
            if kind not in built:
                built[kind] = write(tmp_path_factory.mktemp(f"{kind}_tiny"))
            return built[kind]
        path = SHARED / "fixtures" / f"{kind}_tiny"
        if not path.is_dir():
            pytest.skip(f"{path} is missing")
        return path

    return folder


def read_jsonl(path: Path, limit: int) -> list[dict]:
    rows = []
    with path.open() as handle:
        for line in handle:
            rows.append(json.loads(line))
            if len(rows) == limit:
                break
    return rows


@pytest.fixture(scope="session")
def gsm8k_rows() -> list[dict]:
    """The first 64 GSM8K train rows as prompt/completion."""
    return [{"prompt": r["question"], "completion": r["answer"]} for r in read_jsonl(GSM8K_TRAIN, 64)]


@pytest.fixture(scope="session")
def tokenizer(gsm8k_rows):
    texts = [r["prompt"] + "\n" + r["completion"] for r in gsm8k_rows]
    return make_tokenizer(texts, vocab_size=400)


def tiny_student(tokenizer, kind: str = "llada", seed: int = 0, hidden: int = 32, layers: int = 2) -> torch.nn.Module:
    """A random bidirectional Llama (llada), Qwen2 (dream) or ModernBERT (masked_lm) sized for the test tokenizer."""
    torch.manual_seed(seed)
    if kind == "masked_lm":
        from transformers import ModernBertConfig, ModernBertForMaskedLM

        config = ModernBertConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                                  num_hidden_layers=layers, num_attention_heads=4, pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)
        return prepare_student(ModernBertForMaskedLM(config), kind, tokenizer.mask_token_id)
    common = dict(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(LlamaConfig(**common)) if kind == "llada" else Qwen2ForCausalLM(Qwen2Config(**common))
    return prepare_student(model, kind, tokenizer.mask_token_id)


def synthetic_scored_rows(rows: list[dict], tokenizer, num_buckets: int = 8, seed: int = 0) -> list[dict]:
    """Scored rows as the scorer writes them, with ``tokenizer`` as teacher and random NLLs."""
    import numpy as np

    from trims_hf.data.buckets import equal_mass_buckets

    rng = np.random.default_rng(seed)
    scored = []
    for row in rows:
        offsets = tokenizer(row["completion"], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        nll = rng.exponential(size=len(offsets)).astype(np.float32)
        scored.append({**row, "teacher_token_start": [s for s, _ in offsets], "teacher_token_end": [e for _, e in offsets],
                       "teacher_nll": nll.tolist(), "teacher_entropy": (nll / 2).tolist()})
    flat = np.concatenate([r["teacher_nll"] for r in scored])
    buckets, _ = equal_mass_buckets(flat, num_buckets)
    for row, part in zip(scored, np.split(buckets, np.cumsum([len(r["teacher_nll"]) for r in scored])[:-1])):
        row["teacher_bucket"] = part.tolist()
    return scored


@pytest.fixture(scope="module")
def saved_student(tmp_path_factory, tokenizer) -> str:
    """A tiny LLaDA-style student and its tokenizer saved to a folder, as a Hub checkpoint is laid out."""
    folder = tmp_path_factory.mktemp("student")
    tiny_student(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
