"""Trained LLaDA / LLaDA-MoE / LLaDA 2.x / Dream students save as the original checkpoints are, and read back both ways."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from original_reference import load_reference
from peft import get_peft_model
from safetensors.torch import load_file, save_file

from trims_hf import load_student, lora_config

KINDS = ("llada", "llada_moe", "llada2", "dream")
NATIVE_MODEL_TYPE = {"llada": "llama", "llada_moe": "qwen3_moe", "llada2": "glm4_moe", "dream": "qwen2"}


@pytest.fixture
def fixture(original_checkpoint):
    return original_checkpoint


def shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in load_file(folder / "model.safetensors").items()}


def parity(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "parity.safetensors")


def base_folder(fixture, kind: str, tmp_path: Path) -> Path:
    """The fixture with the files an original Hub folder has beside the weights (code, tokenizer)."""
    folder = tmp_path / f"{kind}-base"
    shutil.copytree(fixture(kind), folder)
    (folder / f"modeling_{kind.replace('_', '')}.py").write_text("# the original modeling code\n")
    (folder / "tokenizer_config.json").write_text("{}\n")
    return folder


@pytest.mark.parametrize("kind", KINDS)
def test_saved_student_has_the_original_keys_config_and_files(fixture, kind: str, tmp_path: Path) -> None:
    base = base_folder(fixture, kind, tmp_path)
    load_student(str(base)).save_pretrained(tmp_path / "saved")
    saved = tmp_path / "saved"
    assert shapes(saved) == shapes(base)
    original, written = load_file(base / "model.safetensors"), load_file(saved / "model.safetensors")
    assert all(torch.equal(written[key], value) for key, value in original.items())
    assert json.loads((saved / "config.json").read_text()) == json.loads((base / "config.json").read_text())
    assert (saved / f"modeling_{kind.replace('_', '')}.py").read_text() == "# the original modeling code\n"
    assert (saved / "tokenizer_config.json").is_file()


@pytest.mark.parametrize("kind", KINDS)
def test_saved_student_gives_the_parity_logits_in_the_original_reference(fixture, kind: str, tmp_path: Path) -> None:
    load_student(str(fixture(kind))).save_pretrained(tmp_path)
    expected = parity(fixture(kind))
    with torch.no_grad():
        logits = load_reference(str(tmp_path), kind)(expected["input_ids"])
    torch.testing.assert_close(logits, expected["logits"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_merged_lora_student_saves_loadable_by_the_original_reference(fixture, kind: str, tmp_path: Path) -> None:
    student = load_student(str(fixture(kind)))
    peft_model = get_peft_model(student, lora_config(student, r=4))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    merged = peft_model.merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    input_ids = parity(fixture(kind))["input_ids"]
    with torch.no_grad():
        ours = merged(input_ids=input_ids).logits
        reference = load_reference(str(tmp_path / "merged"), kind)(input_ids)
    assert (ours - parity(fixture(kind))["logits"]).abs().max() > 1e-2  # the adapter changed the model
    torch.testing.assert_close(reference, ours, atol=1e-4, rtol=1e-4)
    again = load_student(str(tmp_path / "merged"))
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=input_ids).logits, ours, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_native_layout_saves_and_reads_back(fixture, kind: str, tmp_path: Path) -> None:
    load_student(str(fixture(kind))).save_pretrained(tmp_path, layout="native")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == NATIVE_MODEL_TYPE[kind]
    assert "model.layers.0.input_layernorm.weight" in shapes(tmp_path)
    expected = parity(fixture(kind))
    with torch.no_grad():
        logits = load_student(str(tmp_path))(input_ids=expected["input_ids"]).logits
    torch.testing.assert_close(logits, expected["logits"], atol=1e-4, rtol=1e-4)


def test_dream_saved_with_top_level_rope_theta(fixture, tmp_path: Path) -> None:
    load_student(str(fixture("dream"))).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["model_type"], config["rope_theta"], config["mask_token_id"]) == ("Dream", 1e6, 255)
    assert config["auto_map"]["AutoModel"] == "modeling_dream.DreamModel"


def test_checkpoint_with_unknown_weight_names_is_refused(fixture, tmp_path: Path) -> None:
    """A LLaDA saved with the corrupted norm names of earlier versions fails naming them, not with random norms."""
    shutil.copy(fixture("llada") / "config.json", tmp_path / "config.json")
    state = load_file(fixture("llada") / "model.safetensors")
    state = {key.replace(".attn_norm.", ".attn_transformer.ln_f."): value for key, value in state.items()}
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="attn_transformer.ln_f"):
        load_student(str(tmp_path))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("strict", [True, False])
def test_weights_saved_in_the_original_layout_load_back_through_load_state_dict(fixture, kind, strict, tmp_path):
    """The Trainer resumes a full fine-tune (and loads its best model) with ``load_state_dict(strict=False)``: a
    checkpoint it wrote in the original layout must restore every weight, not leave the loaded ones with a warning."""
    trained = load_student(str(fixture(kind)))
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(0.01)
    trained.save_pretrained(tmp_path)
    fresh = load_student(str(fixture(kind)))
    result = fresh.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=strict)
    assert not result.missing_keys and not result.unexpected_keys
    for (name, expected), actual in zip(trained.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(expected, actual), name
