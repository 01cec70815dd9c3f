"""The newer students end to end: their recipes, and `trims train` / `trims export` / `trims eval` on a tiny LLaDA-MoE
and a tiny LLaDA 2.x in the original layout (LLaDA 1.5, Dream-Coder and DiffuCoder run the LLaDA / Dream code paths
tested elsewhere)."""

from __future__ import annotations

import json
import logging.handlers
import shutil
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import DATA, FIXTURES, synthetic_scored_rows
from helpers_students import write_llada2_checkpoint, write_llada_moe_checkpoint
from original_reference import load_reference
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoTokenizer

from trims_hf import load_student
from trims_hf.cli import main
from trims_hf.commands.recipe import parse_recipe
from trims_hf.students import detect_student_kind, load_student_tokenizer

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
NEW_RECIPES = {  # recipe -> (student kind, a config.json of that family as its Hub checkpoint has it)
    "llada15/trims_s1k.yaml": ("llada", {"model_type": "llada", "d_model": 4096, "n_layers": 32}),
    "llada_moe/trims_s1k.yaml": ("llada_moe", {"model_type": "llada", "num_experts": 64, "hidden_size": 2048}),
    "llada2/trims_s1k.yaml": ("llada2", {"model_type": "llada2_moe", "num_experts": 256, "hidden_size": 2048}),
    "dream_coder/trims_s1k.yaml": ("dream", {"model_type": "Dream", "hidden_size": 3584}),
    "diffucoder/trims_s1k.yaml": ("dream", {"model_type": "Dream", "hidden_size": 3584}),
}


@pytest.mark.parametrize("recipe", sorted(NEW_RECIPES))
def test_new_recipes_parse_and_name_the_kind_their_checkpoint_is_detected_as(recipe):
    model_args, _, config = parse_recipe(RECIPES / recipe, ["--bf16", "false", "--use_cpu", "true"])
    kind, hub_config = NEW_RECIPES[recipe]
    assert model_args.model_kind == kind == detect_student_kind(hub_config)
    assert (config.max_length, config.num_buckets, config.trajectory_ratio, model_args.lora_r) == (1024, 8, 0.1, 32)


MOE_STUDENTS = {  # kind -> (writer, modeling file, LoRA targets, eval flags)
    "llada_moe": (write_llada_moe_checkpoint, "modeling_lladamoe.py", ["k_proj", "o_proj", "q_proj", "v_proj"], []),
    "llada2": (write_llada2_checkpoint, "modeling_llada2_moe.py", ["o_proj", "query_key_value"],
               ["--strategy", "threshold_quota", "--threshold", "0.95"]),
}


@pytest.fixture(scope="module")
def moe_hub_folder(tmp_path_factory, tokenizer):
    """``kind`` -> a tiny Hub folder of that MoE family: original config and per-expert weights, its tokenizer, its
    modeling file."""
    built = {}

    def folder(kind: str) -> Path:
        if kind not in built:
            write, modeling, _, _ = MOE_STUDENTS[kind]
            built[kind] = write(tmp_path_factory.mktemp(f"{kind}-hub"), tokenizer)
            (built[kind] / modeling).write_text("# the original modeling code\n")
        return built[kind]

    return folder


def original_folder(kind: str, moe_hub_folder, tokenizer, folder: Path, **config: Any) -> Path:
    """A Hub folder of ``kind`` in the original layout with a tokenizer beside it (the MoE students' written by the test,
    LLaDA's and Dream's config from tests/fixtures), its config updated with ``config``."""
    if kind in MOE_STUDENTS:
        shutil.copytree(moe_hub_folder(kind), folder)
    else:
        folder.mkdir()
        shutil.copy(FIXTURES / f"{kind}_tiny" / "config.json", folder)
        tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(json.loads((folder / "config.json").read_text()) | config))
    return folder


@contextmanager
def transformers_lines() -> Iterator[tuple[list, list]]:
    """The warnings raised and the transformers log records made inside (its loggers do not propagate to pytest's)."""
    logged = logging.handlers.BufferingHandler(capacity=100)
    logging.getLogger("transformers").addHandler(logged)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught, logged.buffer
    finally:
        logging.getLogger("transformers").removeHandler(logged)


@pytest.mark.parametrize("kind", ["llada", "dream", *sorted(MOE_STUDENTS)])
def test_an_original_checkpoints_tokenizer_loads_as_transformers_reads_it_without_a_line(kind, moe_hub_folder,
                                                                                         tokenizer, tmp_path):
    folder = original_folder(kind, moe_hub_folder, tokenizer, tmp_path / kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the lines the test checks ours for
        reference = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    with transformers_lines() as (caught, logged):
        ours = load_student_tokenizer(str(folder))
    assert [str(warning.message) for warning in caught] == []
    assert [record.getMessage() for record in logged] == []
    assert type(ours) is type(reference) and ours.get_vocab() == reference.get_vocab()
    assert ours.all_special_tokens == reference.all_special_tokens and ours.mask_token_id == reference.mask_token_id
    text = "Natalia sold 48 clips in April."
    assert ours(text).input_ids == reference(text).input_ids


def test_a_student_tokenizer_leaves_out_only_its_own_threads_model_type_line(moe_hub_folder, tokenizer, tmp_path,
                                                                             monkeypatch):
    """What else the config reader says still shows (an out-of-vocabulary special token id of the config), and so does
    the model-type line of another thread (a model loaded beside it); the reader keeps no filter afterwards."""
    reader = logging.getLogger("transformers.configuration_utils")
    bare = "You are using a model of type `x` to instantiate a model of type ``."
    load = AutoTokenizer.from_pretrained

    def with_another_thread(*args, **kwargs):
        other = threading.Thread(target=reader.warning, args=(bare + " (another thread)",))
        other.start()
        other.join()
        reader.warning(bare + " (this call)")
        return load(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", with_another_thread)
    folder = original_folder("llada2", moe_hub_folder, tokenizer, tmp_path / "llada2", bos_token_id=70_001)
    with transformers_lines() as (caught, logged):
        load_student_tokenizer(str(folder))
    messages = [record.getMessage() for record in logged]
    assert bare + " (another thread)" in messages and bare + " (this call)" not in messages
    assert any(message.startswith("Model config: bos_token_id must be `None` or an integer within the vocabulary")
               and "got 70001" in message for message in messages)
    assert [str(warning.message) for warning in caught] == [] and reader.filters == []


def test_a_student_tokenizer_takes_autotokenizers_arguments_and_refuses_remote_code(moe_hub_folder, tokenizer,
                                                                                     tmp_path):
    """Every argument reaches ``AutoTokenizer``: ``subfolder`` (the tokenizer files are only there), and a ``config``
    that names the tokenizer class the files do not; asking for remote code is refused."""
    from transformers import PreTrainedConfig

    sub = tmp_path / "repo" / "sub"
    shutil.copytree(moe_hub_folder("llada2"), sub)
    settings = json.loads((sub / "tokenizer_config.json").read_text())
    (sub / "tokenizer_config.json").write_text(json.dumps({**settings, "tokenizer_class": None}))
    assert load_student_tokenizer(str(tmp_path / "repo"), subfolder="sub").get_vocab() == tokenizer.get_vocab()
    named = load_student_tokenizer(str(tmp_path / "repo"), subfolder="sub",
                                   config=PreTrainedConfig(tokenizer_class="GPT2Tokenizer"))
    assert type(named).__name__ == "GPT2Tokenizer"
    with pytest.raises(ValueError, match="^load_student_tokenizer runs no remote code"):
        load_student_tokenizer(str(moe_hub_folder("llada2")), trust_remote_code=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(MOE_STUDENTS))
def test_moe_student_trains_exports_and_evaluates_from_its_recipe(kind, moe_hub_folder, tokenizer, gsm8k_rows, tmp_path):
    _, modeling, targets, eval_flags = MOE_STUDENTS[kind]
    folder = moe_hub_folder(kind)
    rows = tmp_path / "scored.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in synthetic_scored_rows(gsm8k_rows[:16], tokenizer)))
    run = tmp_path / "run"
    assert main(["train", "--config", str(RECIPES / kind / "trims_s1k.yaml"), "--model_name_or_path", str(folder),
                 "--dataset_name", str(rows), "--output_dir", str(run), "--max_steps", "2", "--use_cpu", "true",
                 "--bf16", "false", "--dtype", "float32", "--max_length", "512", "--lora_r", "4",
                 "--global_batch_size", "null", "--compile_blocks", "false",  # the split by hand, eager
                 "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--save_strategy", "no",
                 "--padding", "longest", "--num_train_epochs", "1"]) == 0
    state = json.loads((run / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and all(entry["loss"] > 0 for entry in state["log_history"] if "loss" in entry)
    adapter = json.loads((run / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == targets

    ids = load_file(folder / "parity.safetensors")["input_ids"]
    with torch.no_grad():
        ours = load_student(str(folder), adapter=str(run)).eval()(input_ids=ids).logits
        base = load_student(str(folder))(input_ids=ids).logits
    assert (ours - base).abs().max() > 0  # the trained adapter changed the model

    merged, exported = tmp_path / "merged", tmp_path / "adapter"
    assert main(["export", "--model", str(folder), "--adapter", str(run), "--output", str(merged)]) == 0
    assert main(["export", "--model", str(folder), "--adapter", str(run), "--output", str(exported),
                 "--format", "adapter"]) == 0
    assert set(load_file(merged / "model.safetensors")) == set(load_file(folder / "model.safetensors"))
    assert json.loads((merged / "config.json").read_text()) == json.loads((folder / "config.json").read_text())
    assert (merged / modeling).is_file() and (merged / "tokenizer_config.json").is_file()
    with torch.no_grad():
        torch.testing.assert_close(load_reference(str(merged), kind)(ids), ours, atol=1e-4, rtol=1e-4)
        original = PeftModel.from_pretrained(load_reference(str(folder), kind), exported)  # the original module names
        torch.testing.assert_close(original(ids), ours, atol=1e-4, rtol=1e-4)

    output = tmp_path / "eval.json"
    assert main(["eval", "--model", str(folder), "--adapter", str(run), "--task", "gsm8k", "--data-file",
                 str(DATA / "gsm8k" / "test.jsonl"), "--output", str(output), "--gen-length", "16",
                 "--block-length", "8", "--limit", "2", "--no-progress", *eval_flags]) == 0
    (result,) = json.loads(output.read_text())["results"]
    assert result["num_samples"] == 2 and result["nfe"] >= 2 and result["generated_tokens"] > 0


CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
          "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""The Qwen (ChatML) turn structure Dream-Coder's and DiffuCoder's templates share (apple/ml-diffucoder README)."""


@pytest.fixture
def coder_tokenizer(tokenizer):
    """The test tokenizer with the coders' special tokens (EOS ``<|endoftext|>``, mask ``<|mask|>``, ``<|dlm_pad|>``)
    and a ChatML template, as their Hub tokenizers have them."""
    from copy import deepcopy

    coder = deepcopy(tokenizer)
    coder.add_special_tokens({"eos_token": "<|endoftext|>", "mask_token": "<|mask|>",
                              "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|dlm_pad|>"]})
    coder.chat_template = CHATML
    return coder


@pytest.mark.parametrize("recipe", ["dream_coder/trims_s1k.yaml", "diffucoder/trims_s1k.yaml"])
def test_coder_recipes_end_responses_where_their_templates_do(recipe, coder_tokenizer):
    from trims_hf.prompts import end_of_response_ids

    _, _, config = parse_recipe(RECIPES / recipe, ["--bf16", "false", "--use_cpu", "true"])
    ids = end_of_response_ids(coder_tokenizer, config.end_of_response)
    tokens = coder_tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == "<|im_end|>" == coder_tokenizer.convert_ids_to_tokens(end_of_response_ids(coder_tokenizer, None))[0]
    assert tokens[1] == ("<|dlm_pad|>" if recipe.startswith("diffucoder") else "<|endoftext|>")


def test_coder_checkpoints_are_dream_students_with_their_mask_id(original_checkpoint, tmp_path):
    """A Dream-architecture checkpoint with a coder's config (``model_type: Dream``, its own ids) loads as Dream, with
    the config's mask id, and gives the original Dream logits."""
    import shutil

    from trims_hf import mask_token_id, student_spec

    shutil.copytree(original_checkpoint("dream"), tmp_path / "coder")
    config = json.loads((tmp_path / "coder" / "config.json").read_text())
    (tmp_path / "coder" / "config.json").write_text(json.dumps({**config, "mask_token_id": 250, "bos_token_id": 253}))
    model = load_student(str(tmp_path / "coder"))
    assert student_spec(model).kind == "dream" and mask_token_id(model) == 250
    parity = load_file(original_checkpoint("dream") / "parity.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=parity["input_ids"]).logits, parity["logits"], atol=1e-4, rtol=1e-4)


def test_llada_moe_decodes_the_same_tokens_in_every_step_mode(original_checkpoint):
    """The MoE student's forward goes through the static step (buffers written in place, one padding mask) as
    LLaDA's and Dream's do: the same tokens, fills and forwards as the eager step, batch 1 and left-padded."""
    from dataclasses import replace

    from trims_hf import load_student
    from trims_hf.generation import DecodingConfig, generate

    model = load_student(str(original_checkpoint("llada_moe"))).eval()
    ids = torch.randint(3, 200, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :5] = mask[2, :2] = 0
    for cache in ("none", "dual"):
        for batch in ((ids[:1], None), (ids, mask)):
            config = DecodingConfig(gen_length=16, block_length=8, threshold=0.3, cache=cache, early_stop=False,
                                    step="eager")
            eager = generate(model, *batch, config)
            static = generate(model, *batch, replace(config, step="static"))
            assert torch.equal(static.sequences, eager.sequences) and static.nfe == eager.nfe
