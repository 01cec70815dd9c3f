"""Parallel block decoding for masked-diffusion students (LLaDA fixed steps, Fast-dLLM rules).

The response starts as masks after the prompt and is decoded block by block, left to right. Each step is
one model call: every masked position of the current block gets a proposal (argmax, or a tempered sample)
and a score (the model probability of the proposal, in float64, or the entropy of its distribution); a
:class:`Strategy` picks which candidates to commit, and the decoder always commits at least the best one
so every step makes progress. Committed tokens are never remasked.

Early stop (default on) never changes a token up to the first stop: with bidirectional attention the masks
of the block still being decoded see every later position, so nothing is touched while a sample's block
has masks. Once the block holding a sample's first stop token is fully decoded, every position after that
stop becomes EOS; later blocks made only of EOS cost no forward (a batch skips a block only when all its
samples are done). Everything up to the stop is then committed, and committed tokens never change.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import replace

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ..prompts import Prompt, end_of_response_ids, prompt_token_ids
from ..settings import DecodingConfig, PromptFormat, ResponseFormat
from ..students import compile_blocks, mask_token_id, student_spec
from .block_causal import decode_block_causal
from .cache import StudentForward, resolve_step
from .hooks import DecodeHook, GenerationStart, StepRecord, answer_text
from .steps import GenerationOutput, build_strategy, early_stop_fill, propose, tokens_before_stop


def _eos_ids(model: nn.Module) -> list[int]:
    eos = getattr(model.config.get_text_config(), "eos_token_id", None)
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def _check_prompts(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   config: DecodingConfig, sample_ids: Sequence[Hashable] | None) -> None:
    """Refuse, in one line before any forward, prompts the decoder would read wrongly: ids outside the vocabulary, a
    row with no real token (a shifted student reads its first response token from the last prompt position), a mask
    of other values than 0 and 1 (positions are counted from it), a response reaching past the model's positions, and
    ``sample_ids`` that do not name every row (the hooks would drop the rest)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
        raise ValueError(f"input_ids: a 2-D tensor of token ids (batch, prompt length), got "
                         f"{tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__}"
                         f"{'' if not isinstance(input_ids, torch.Tensor) else ' ' + str(input_ids.dtype)}.")
    text = model.config.get_text_config()
    vocab_size = getattr(text, "vocab_size", None)
    if input_ids.numel() and (int(input_ids.min()) < 0 or (vocab_size is not None and int(input_ids.max()) >= vocab_size)):
        bad = input_ids.lt(0) | (input_ids.ge(vocab_size) if vocab_size is not None else False)
        row, column = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"input_ids: {int(input_ids[row, column])} at row {row}, column {column} is not a token id of "
                         f"the model's vocabulary (0 to {vocab_size - 1 if vocab_size is not None else '...'}).")
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"attention_mask: shape {tuple(attention_mask.shape)}, not input_ids' "
                             f"{tuple(input_ids.shape)}.")
        if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask: 1 for a real prompt token and 0 for padding, nothing else (got "
                             f"{sorted(set(attention_mask.flatten().tolist()) - {0, 1})[:3]}).")
    real = attention_mask.sum(dim=1) if attention_mask is not None else input_ids.new_full((input_ids.shape[0],),
                                                                                             input_ids.shape[1])
    if input_ids.shape[0] == 0 or bool((real == 0).any()):
        row = int((real == 0).nonzero()[0, 0]) if input_ids.shape[0] else None
        raise ValueError("input_ids: no prompts given." if row is None else
                         f"input_ids: row {row} has no real prompt token; a response is decoded after a prompt of at "
                         "least one token (e.g. BOS).")
    if problem := past_the_positions(getattr(text, "max_position_embeddings", None), int(real.max()), config.gen_length):
        raise ValueError(f"{problem}.")
    if sample_ids is not None and len(sample_ids) != input_ids.shape[0]:
        raise ValueError(f"sample_ids: {len(sample_ids)} names for {input_ids.shape[0]} rows; name every row once.")


def past_the_positions(positions: int | None, prompt_length: int, gen_length: int) -> str | None:
    """Why ``gen_length`` tokens after a prompt of ``prompt_length`` do not fit a model of ``positions`` positions
    (``max_position_embeddings``, which training refuses to exceed too), or None when they do."""
    if not isinstance(positions, int) or prompt_length + gen_length <= positions:
        return None
    return (f"gen_length={gen_length} after a prompt of {prompt_length} tokens reaches position "
            f"{prompt_length + gen_length - 1}, past the model's max_position_embeddings={positions}")


def _check_stop_ids(eos_id: int | None, stop_ids: Sequence[int], mask_id: int) -> None:
    """The mask id is what an undecoded position holds: as a stop it would end every response at its first masked
    position, and as the EOS fill it would leave the rest of a response masked."""
    if eos_id == mask_id:
        raise ValueError(f"eos_token_id={eos_id} is the student's mask id; the EOS fill must be a token.")
    if mask_id in stop_ids:
        raise ValueError(f"stop_token_ids: {mask_id} is the student's mask id, which every undecoded position holds.")


def _check_left_padded(attention_mask: torch.Tensor | None) -> None:
    """Refuse a right-padded (or holed) prompt batch: the decoders count positions and append the response after the
    last column, so a 0 after a 1 would put padding inside the context."""
    if attention_mask is None:
        return
    real = attention_mask.bool()
    holes = (real.long().cummax(dim=1).values.bool() & ~real).any(dim=1)
    if bool(holes.any()):
        row = int(holes.nonzero()[0, 0])
        raise ValueError(f"prompts must be left-padded: row {row} of attention_mask has a 0 after a 1 "
                         "(tokenize with padding_side='left')")


@torch.no_grad()
def generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: DecodingConfig | None = None,
    hooks: Sequence[DecodeHook] = (),
    sample_ids: Sequence[Hashable] | None = None,
) -> GenerationOutput:
    """Decode ``config.gen_length`` tokens after each (LEFT-padded) prompt with a prepared student.

    ``attention_mask`` marks real prompt tokens (1) and left padding (0); positions are counted from each
    sample's first real token, so a padded sample decodes exactly as it would alone. ``sample_ids`` name
    the rows for the hooks (default: consecutive integers per recorder). A block-diffusion student (LLaDA 2.x)
    decodes with its block-causal attention instead (:mod:`trims_hf.generation.block_causal`).
    """
    config = replace(config or DecodingConfig())  # checked again: a field may have been set after it was made
    _check_prompts(model, input_ids, attention_mask, config, sample_ids)
    _check_left_padded(attention_mask)
    if (vocab_size := getattr(model.config.get_text_config(), "vocab_size", None)) is not None:
        config.check_token_ids(vocab_size)
    spec, mask_id = student_spec(model), mask_token_id(model)
    device = input_ids.device
    step = resolve_step(config.step, device, spec, model)  # a step the model cannot run is refused before anything runs
    if config.compile_blocks:
        # Symbolic lengths from the start: one compile serves every window and prompt length (specialised to the first
        # call's length, a block would compile again at the first window).
        compile_blocks(model, dynamic=True)
    strategy = build_strategy(config)
    batch, prompt_length = input_ids.shape
    eos_ids = _eos_ids(model)
    eos_id = config.eos_token_id if config.eos_token_id is not None else (eos_ids[0] if eos_ids else None)
    stop_ids = tuple(config.stop_token_ids if config.stop_token_ids is not None else eos_ids)
    if config.early_stop and (eos_id is None or not stop_ids):
        raise ValueError("early_stop needs an EOS id and stop ids; set DecodingConfig.eos_token_id / stop_token_ids.")
    _check_stop_ids(eos_id, stop_ids, mask_id)
    stops = torch.tensor(stop_ids, dtype=input_ids.dtype, device=device)
    generator = torch.Generator(device=device).manual_seed(config.seed) if config.seed is not None else None

    start = GenerationStart(
        batch, prompt_length, config, stop_ids, eos_id, tuple(sample_ids) if sample_ids is not None else None
    )
    for hook in hooks:
        hook.on_start(start)
    if spec.block_size is not None:
        output = decode_block_causal(model, input_ids, attention_mask, config, step, strategy, stops, eos_id, generator,
                                     hooks)
        for hook in hooks:
            hook.on_end(output)
        return output

    x = torch.cat([input_ids, input_ids.new_full((batch, config.gen_length), mask_id)], dim=1)
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(batch, config.gen_length)], dim=1)
        position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    else:
        position_ids = torch.arange(x.shape[1], device=device).expand(batch, -1)
    forward = StudentForward(model, spec, config.cache, attention_mask, position_ids, step)
    nfe, sample_nfe = 0, torch.zeros(batch, dtype=torch.long, device=device)
    response = x[:, prompt_length:]  # a view: writes go to x
    for block in range(config.num_blocks):
        begin = block * config.block_length
        end = begin + config.block_length
        masked = response[:, begin:end] == mask_id
        initial = masked.sum(dim=1)
        step_in_block = 0
        while masked.any():
            logits = forward(x, prompt_length + begin, prompt_length + end, refresh=step_in_block == 0)
            charged = masked.any(dim=1)
            nfe, sample_nfe = nfe + 1, sample_nfe + charged
            tokens, confidence, scores = propose(logits, mask_id, config.temperature, generator, strategy.score,
                                                  strategy.tempered)
            commit = strategy.select(scores, masked, step_in_block, initial)
            if step_in_block == 0 and forward.commits_block_head_at_refresh:
                commit[:, 0] |= masked[:, 0]
            response[:, begin:end] = torch.where(commit, tokens, response[:, begin:end])
            masked = response[:, begin:end] == mask_id
            filled = torch.zeros_like(response, dtype=torch.bool)
            if config.early_stop:
                filled = early_stop_fill(response, stops, eos_id, finished=~masked.any(dim=1))
                response.masked_fill_(filled, eos_id)
            if hooks:
                committed = torch.zeros_like(response, dtype=torch.bool)
                committed[:, begin:end] = commit
                confidences = torch.full(response.shape, float("nan"), dtype=torch.float64, device=device)
                confidences[:, begin:end] = torch.where(commit, confidence, confidences[:, begin:end])
                record = StepRecord(
                    nfe - 1, block, charged, sample_nfe.clone(), committed, confidences, filled, response.clone()
                )
                for hook in hooks:
                    hook.on_step(record)
            step_in_block += 1
    output = GenerationOutput(x, prompt_length, nfe, sample_nfe, config.early_stop)
    for hook in hooks:
        hook.on_end(output)
    return output


def generate_text(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    config: DecodingConfig | None = None,
    hooks: Sequence[DecodeHook] = (),
    sample_ids: Sequence[Hashable] | None = None,
    prompt_format: PromptFormat | None = None,
    stop_strings: Sequence[str] = (),
) -> list[str]:
    """Render (:func:`trims_hf.prompts.prompt_token_ids`, as in training), left-pad and decode ``prompts``; returns
    the answers (:func:`~trims_hf.generation.hooks.answer_text`): cut before their first stop token, then before the
    earliest of ``stop_strings``. Stop ids default to the model's and the tokenizer's EOS ids plus the ids that end
    a response in training (:func:`trims_hf.prompts.end_of_response_ids` of a :class:`ResponseFormat`'s
    ``end_of_response``; by default the chat template's end of turn, e.g. LLaDA's ``<|eot_id|>``)."""
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts: a list of prompts" + (" (wrap one prompt in a list)." if prompts else "; got none."))
    config = config or DecodingConfig()
    fmt = prompt_format or ResponseFormat()
    encoded = [prompt_token_ids(tokenizer, prompt, fmt) for prompt in prompts]
    batch = tokenizer.pad({"input_ids": encoded}, padding=True, padding_side="left", return_tensors="pt")
    eos_ids = dict.fromkeys(_eos_ids(model) + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
                            + end_of_response_ids(tokenizer, getattr(fmt, "end_of_response", None)))
    config = replace(
        config,
        stop_token_ids=config.stop_token_ids if config.stop_token_ids is not None else tuple(eos_ids),
        eos_token_id=config.eos_token_id if config.eos_token_id is not None else next(iter(eos_ids), None),
    )
    device = next(model.parameters()).device
    output = generate(
        model, batch["input_ids"].to(device), batch["attention_mask"].to(device), config, hooks, sample_ids
    )
    lengths = tokens_before_stop(output.responses, config.stop_token_ids).tolist()
    return [answer_text(tokenizer, row[:length], stop_strings)[0]
            for row, length in zip(output.responses.tolist(), lengths)]
