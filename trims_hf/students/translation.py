"""Shared pieces of the ports' config translations (:mod:`.llada`, :mod:`.llada_moe`, :mod:`.llada2`, :mod:`.dream`):
an original ``config.json`` dict overlaid with translated fields, its special token ids, and the one RoPE the
original codes write back. Plain dict functions, apart from the save / load machinery of :mod:`.layout`."""

from __future__ import annotations

from typing import Any


def overlay(original: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``original`` with ``fields`` set; a field that is None and absent from ``original`` stays absent, as the
    original file has it."""
    return {**original, **{key: value for key, value in fields.items() if value is not None or key in original}}


def special_token_ids(original: dict[str, Any], default_mask_id: int) -> dict[str, Any]:
    """The pad / BOS / EOS / mask ids of an original ``config.json`` dict, as every family's native config takes them
    (the mask id defaults to the family's, which its Hub config does not name)."""
    return {"pad_token_id": original.get("pad_token_id"), "bos_token_id": original.get("bos_token_id"),
            "eos_token_id": original.get("eos_token_id"),
            "mask_token_id": original.get("mask_token_id", default_mask_id)}


def default_rope(config: Any, family: str) -> dict[str, Any]:
    """``config.rope_parameters``, refused unless the default RoPE, the only one the original codes write back."""
    rope = config.rope_parameters or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_parameters={rope!r}: {family}'s original code has only the default RoPE; save with "
                         "layout='native'")
    return rope
