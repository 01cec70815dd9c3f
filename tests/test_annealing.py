"""trims_hf.studies.annealing: DiffuLLaMA's causal-to-bidirectional attention schedule for a student's training forwards."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trims_hf import prepare_student
from trims_hf.studies.annealing import AttentionAnnealing, annealed_mask


def test_mask_goes_from_causal_to_full_and_keeps_the_causal_part():
    assert torch.equal(annealed_mask(6, 0.0), torch.ones(6, 6, dtype=torch.bool).tril())
    assert bool(annealed_mask(6, 1.0).all())
    mask = annealed_mask(200, 0.3, torch.Generator().manual_seed(0))
    assert bool(mask.tril().eq(torch.ones(200, 200, dtype=torch.bool).tril()).all())  # every earlier key kept
    upper = mask.triu(1).sum().item() / (200 * 199 / 2)
    assert 0.27 < upper < 0.33  # each later key with probability 0.3


def student() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=64)
    return prepare_student(LlamaForCausalLM(config), "dream", mask_token_id=49)


def logits(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask).logits


def test_training_forwards_are_causal_at_first_bidirectional_after_the_schedule_and_decoding_never_changes():
    model = student().train()
    ids = torch.randint(0, 40, (2, 10))
    later = ids.clone()
    later[:, 7] = 41  # a token after position 6: a causal model's outputs before it cannot see it
    ones = torch.ones_like(ids)
    annealing = AttentionAnnealing(model, anneal_steps=10**9)
    early = logits(model, ids, ones), logits(model, later, ones)
    assert torch.allclose(early[0][:, :7], early[1][:, :7])  # Dream shifts logits by one: position i predicts i+1
    assert not torch.allclose(early[0][:, 8:], early[1][:, 8:])
    assert annealing.forwards == 2
    model.eval()
    with torch.no_grad():
        decoded = logits(model, ids, ones), logits(model, later, ones)
    assert not torch.allclose(decoded[0][:, :7], decoded[1][:, :7])  # evaluation stays bidirectional
    assert annealing.forwards == 2  # and is not counted
    model.train()
    annealing.forwards = 10**9  # past the schedule: the student's own bidirectional attention
    late = logits(model, ids, ones), logits(model, later, ones)
    assert not torch.allclose(late[0][:, :7], late[1][:, :7])
    annealing.remove()


def test_ratio_follows_the_optimizer_step_with_accumulation():
    annealing = AttentionAnnealing(student(), anneal_steps=4, accumulation=2)
    ratios = []
    for _ in range(10):
        ratios.append(annealing.ratio())
        annealing.forwards += 1
    assert ratios == [0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 1.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="anneal_steps=0"):
        AttentionAnnealing(student(), anneal_steps=0)


def test_padding_stays_hidden_and_no_row_is_empty():
    model = student().train()
    AttentionAnnealing(model, anneal_steps=10**9)
    ids = torch.randint(0, 40, (1, 8))
    padded = ids.clone()
    padded[:, :3] = 0  # left padding, another token there
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    out, other = logits(model, ids, mask), logits(model, padded, mask)
    assert torch.isfinite(out).all()
    assert torch.allclose(out[:, 3:], other[:, 3:], atol=1e-5)  # what stands in the padding is never seen
