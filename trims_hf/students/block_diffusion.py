"""Block diffusion (LLaDA 2.x): the training view of a noised batch.

Pure tensor functions. A block-diffusion student attends causally across blocks of ``block_size`` positions and
bidirectionally inside one. It is trained as dFactory's ``tasks/train_llada2_bd.py`` (and dLLM's ``BD3LMTrainer``)
train LLaDA 2.x, after Arriola et al. (2025): one forward over the noised sequence followed by the clean one,

    input_ids    = [x_t | x_0]                      [B, 2L]
    position_ids = [0..L-1 | 0..L-1]                [B, 2L]
    attention: x_t block j -> x_t block j (block diagonal) and x_0 blocks < j (offset block causal);
               x_0 block j -> x_0 blocks <= j (block causal)

so every noised block is denoised given the clean blocks before it, exactly the context the block decoder gives it,
and the loss is read from the first L logits only. The noise itself (which positions of x_t are masks, TRIMS buckets
included) is the collator's, unchanged: each block of x_t holds the masks the forward process drew for its positions.
"""

from __future__ import annotations

import torch


def block_ids(length: int, block_size: int, device: torch.device | None = None) -> torch.Tensor:
    """The block of each of ``length`` positions ([length]); blocks start at position 0, as decoding aligns them
    (:mod:`trims_hf.generation.block_causal`)."""
    return torch.arange(length, device=device) // block_size


def block_diffusion_mask(length: int, block_size: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool [2 length, 2 length] over ``[x_t | x_0]``: dFactory's ``block_diffusion_mask`` (block diagonal within
    x_t and within x_0, x_t to earlier x_0 blocks, x_0 to x_0 blocks up to its own)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r}: a whole number of positions >= 1.")
    blocks = block_ids(length, block_size, device).repeat(2)
    clean = torch.arange(2 * length, device=device) >= length
    same_half = clean[:, None] == clean[None, :]
    diagonal = (blocks[:, None] == blocks[None, :]) & same_half
    offset_causal = (blocks[:, None] > blocks[None, :]) & ~clean[:, None] & clean[None, :]
    causal = (blocks[:, None] >= blocks[None, :]) & clean[:, None] & clean[None, :]
    return diagonal | offset_causal | causal


def clean_input_ids(input_ids: torch.Tensor, masked: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """x_0 of a noised collator batch ([B, L]): the label where a position was masked (masked positions always carry
    their clean token as label), the input elsewhere."""
    return torch.where(masked, labels, input_ids)


def block_diffusion_inputs(noised: torch.Tensor, clean: torch.Tensor, block_size: int,
                           attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The model inputs of one block-diffusion training forward: ``input_ids`` and ``position_ids`` [B, 2L] and a bool
    ``attention_mask`` [1 or B, 1, 2L, 2L]. With a padding mask ([B, L], 0 = padding) no query attends a padded key
    of either half, except itself, so a padded query still has a key (and finite attention)."""
    batch, length = noised.shape
    allowed = block_diffusion_mask(length, block_size, noised.device)[None, None]
    if attention_mask is not None and not bool(attention_mask.all()):
        real = attention_mask.bool().repeat(1, 2)  # [B, 2L]
        itself = torch.eye(2 * length, dtype=torch.bool, device=noised.device)
        allowed = allowed & (real[:, None, None, :] | itself)
    positions = torch.arange(length, device=noised.device).repeat(2).expand(batch, -1)
    return {"input_ids": torch.cat([noised, clean], dim=1), "position_ids": positions, "attention_mask": allowed}


def noised_half(logits: torch.Tensor, length: int) -> torch.Tensor:
    """The logits of x_t ([B, L, vocab]) from a block-diffusion forward's [B, 2L, vocab]: the ones the loss reads."""
    return logits[:, :length]


def training_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, masked: torch.Tensor,
                    labels: torch.Tensor, block_size: int | None) -> dict[str, torch.Tensor]:
    """The forward's inputs for a collated batch: as collated for a fully bidirectional student (``block_size``
    None), else :func:`block_diffusion_inputs` of the noised and clean sequences."""
    if block_size is None:
        return {"input_ids": input_ids, "attention_mask": attention_mask}
    return block_diffusion_inputs(input_ids, clean_input_ids(input_ids, masked, labels), block_size, attention_mask)
