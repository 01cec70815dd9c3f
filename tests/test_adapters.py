"""Adapters in either naming load exactly or fail naming the keys; exports load into the original code."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES, needs_deepspeed
from original_reference import load_reference
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from trims_hf import AdapterError, load_student, lora_config
from trims_hf.cli import main as cli
from trims_hf.exporting import base_is_original, export_card
from trims_hf.students.adapters import BASE_FINGERPRINT, base_difference, base_fingerprint, write_base_fingerprint


def fixture(kind: str) -> str:
    path = FIXTURES / f"{kind}_tiny"
    if not path.is_dir():
        pytest.skip(f"{path} is missing")
    return str(path)


def input_ids(kind: str) -> torch.Tensor:
    return load_file(Path(fixture(kind)) / "parity.safetensors")["input_ids"]


def randomise(model: torch.nn.Module) -> None:
    """Non-zero LoRA B matrices, so a loaded adapter changes the logits."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))


def native_adapter(kind: str, folder: Path) -> torch.Tensor:
    """A trims_hf adapter (native names) saved to ``folder``; the logits of the student with it."""
    student = load_student(fixture(kind))
    model = get_peft_model(student, lora_config(student, r=4)).eval()
    randomise(model)
    model.save_pretrained(folder)
    with torch.no_grad():
        return model(input_ids=input_ids(kind)).logits


def original_adapter(folder: Path, targets: list[str] | str) -> torch.Tensor:
    """An adapter trained on the original LLaDA code (original names) saved to ``folder``; the reference's logits."""
    model = get_peft_model(load_reference(fixture("llada"), "llada"), LoraConfig(r=4, target_modules=targets)).eval()
    randomise(model)
    model.save_pretrained(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "GSAI-ML/llada_tiny"}))
    with torch.no_grad():
        return model(input_ids("llada"))


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_exported_adapter_loads_with_peft_onto_the_original_model(kind: str, tmp_path: Path) -> None:
    ours = native_adapter(kind, tmp_path / "native")
    assert cli(["export", "--model", fixture(kind), "--adapter", str(tmp_path / "native"), "--output",
                str(tmp_path / "original"), "--format", "adapter"]) == 0
    config = json.loads((tmp_path / "original" / "adapter_config.json").read_text())
    assert config["task_type"] is None
    if kind == "llada":
        assert "model.transformer.blocks.1.ff_out" in config["target_modules"]
        assert "model.transformer.ff_out" not in config["target_modules"]  # the head stays unwrapped
        assert "model.transformer.blocks.0.attn_out" in config["target_modules"]
    reference = PeftModel.from_pretrained(load_reference(fixture(kind), kind), tmp_path / "original")
    with torch.no_grad():
        torch.testing.assert_close(reference(input_ids(kind)), ours, atol=1e-4, rtol=1e-4)


def test_adapter_with_original_names_loads_every_tensor_head_included(tmp_path: Path) -> None:
    """A target list with "ff_out" wraps LLaDA's head too (the name clash); it becomes lm_head, every tensor lands."""
    expected = original_adapter(tmp_path, ["q_proj", "attn_out", "ff_out"])
    with pytest.warns(UserWarning, match="`base_model_name_or_path` was renamed"):  # no record of the base: peft asks
        model = load_student(fixture("llada"), adapter=str(tmp_path))
    assert "lm_head" in model.peft_config["default"].target_modules
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=input_ids("llada")).logits, expected, atol=1e-4, rtol=1e-4)


def test_adapter_of_another_base_fails_before_loading_unless_allowed(tmp_path: Path) -> None:
    original_adapter(tmp_path, ["q_proj"])
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "someone/other-8b"}))
    with pytest.raises(AdapterError, match="trained on 'someone/other-8b'.*--allow-base-mismatch"):
        load_student(fixture("llada"), adapter=str(tmp_path))
    with pytest.warns(UserWarning, match="`base_model_name_or_path` was renamed from 'someone/other-8b'"):
        assert load_student(fixture("llada"), adapter=str(tmp_path), allow_base_mismatch=True) is not None


def test_peft_asks_to_check_a_renamed_base_only_where_the_base_record_did_not(tmp_path):
    """An adapter recorded on the Hub id ``GSAI-ML/llada_tiny`` loads onto the local folder ``llada_tiny``: the name
    check compares last path parts only, so peft's warning that the recorded base was renamed stays, unless the
    adapter's record of its base's weights matched."""
    original_adapter(tmp_path / "elsewhere", ["q_proj"])  # trained outside trims_hf: no record
    native_adapter("llada", tmp_path / "recorded")
    write_base_fingerprint(tmp_path / "recorded", base_fingerprint(load_student(fixture("llada"))))
    config = json.loads((tmp_path / "recorded" / "adapter_config.json").read_text())
    (tmp_path / "recorded" / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": "GSAI-ML/llada_tiny"}))
    shown = {}
    for name in ("elsewhere", "recorded"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = load_student(fixture("llada"), adapter=str(tmp_path / name))
        shown[name] = [str(warning.message) for warning in caught]
        assert model.peft_config["default"].base_model_name_or_path == fixture("llada")
    assert shown["recorded"] == []
    (warning,) = shown["elsewhere"]
    assert warning.startswith("The PEFT config's `base_model_name_or_path` was renamed from 'GSAI-ML/llada_tiny'")


def refilled_base(folder: Path, relative_change: float) -> str:
    """The LLaDA fixture under the same folder name with every weight moved by ``relative_change`` (a fine-tune of it,
    or a folder refilled with another model of the same shapes)."""
    folder.mkdir(parents=True)
    shutil.copytree(fixture("llada"), folder / "llada_tiny")
    weights = folder / "llada_tiny" / "model.safetensors"
    noise = torch.Generator().manual_seed(0)
    save_file({key: value * (1 + relative_change * torch.randn(value.shape, generator=noise))
               for key, value in load_file(weights).items()}, weights, metadata={"format": "pt"})
    return str(folder / "llada_tiny")


def test_adapter_refuses_a_base_of_its_base_name_with_other_weights(tmp_path: Path) -> None:
    """The recorded sample of the base's weights, not its name, decides: the same checkpoint loaded in any float
    precision passes, the same folder name holding moved weights is refused (also once exported), unless allowed."""
    native_adapter("llada", tmp_path / "adapter")
    write_base_fingerprint(tmp_path / "adapter", base_fingerprint(load_student(fixture("llada"))))
    adapter = str(tmp_path / "adapter")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert load_student(fixture("llada"), adapter=adapter, dtype=dtype).dtype == dtype
    other = refilled_base(tmp_path / "other", relative_change=0.02)
    with pytest.raises(AdapterError, match=rf"^adapter {adapter} was trained on a base with other weights than "
                                           rf"{other}: \d{{3}} of 336 sampled weights differ beyond rounding "
                                           r"\(lm_head\.weight first\); if"):
        load_student(other, adapter=adapter)
    with pytest.warns(UserWarning, match="`base_model_name_or_path` was renamed"):  # allowed, and peft still asks
        assert load_student(other, adapter=adapter, allow_base_mismatch=True) is not None
    assert cli(["export", "--model", fixture("llada"), "--adapter", adapter, "--output", str(tmp_path / "original"),
                "--format", "adapter"]) == 0
    with pytest.raises(AdapterError, match="other weights"):
        load_student(other, adapter=str(tmp_path / "original"))
    assert load_student(fixture("llada"), adapter=str(tmp_path / "original")) is not None


def test_base_record_refuses_one_value_moved_by_one_step_and_skips_offloaded_weights() -> None:
    """Under one dtype a sampled value must be the recorded one bit for bit; a weight on the meta device (offloaded,
    no values) is left out of the comparison, the others still compared."""
    base = torch.nn.Linear(64, 64)
    recorded = base_fingerprint(base)
    with torch.no_grad():
        base.weight.view(-1)[64 * 64 // 16] = torch.nextafter(base.weight.view(-1)[256], torch.tensor(1.0))
    assert base_difference(recorded, base_fingerprint(base)) == "1 of 32 sampled weights differ beyond rounding (weight first)"
    base.weight = torch.nn.Parameter(torch.empty(64, 64, device="meta"))
    assert base_difference(recorded, base_fingerprint(base)) is None
    with torch.no_grad():
        base.bias.add_(1e-3)
    assert base_difference(recorded, base_fingerprint(base)) == "16 of 16 sampled weights differ beyond rounding (bias first)"


def test_base_record_reads_infinities_and_nan_as_the_values_they_are() -> None:
    """Across dtypes an infinity agrees only with the same infinity, or with a value that overflows to it in the
    narrower dtype, and NaN only with NaN; the finite values keep their rounding tolerance."""
    specials = torch.tensor([float("inf"), float("-inf"), float("nan"), 7e4, 1.0, -2.5, 3e-3, 0.0])
    base = torch.nn.Linear(2, 8, bias=False)
    with torch.no_grad():
        base.weight.copy_(specials.repeat(2, 1).T)  # 16 values: each sampled
    recorded = base_fingerprint(base)
    for dtype in (torch.bfloat16, torch.float16):  # 7e4 is past float16's largest finite value: inf there
        assert base_difference(recorded, base_fingerprint(copy.deepcopy(base).to(dtype))) is None, dtype
    for index, value in ((4, float("inf")), (0, float("-inf")), (0, 1.0), (2, 0.0), (4, float("nan"))):
        changed = torch.nn.Linear(2, 8, bias=False)
        with torch.no_grad():
            changed.weight.copy_(base.weight)
            changed.weight[index] = value
        assert base_difference(recorded, base_fingerprint(changed.to(torch.bfloat16))) == \
            "2 of 16 sampled weights differ beyond rounding (weight first)", (index, value)


def test_base_record_compares_quantized_weights_with_their_own_kind_only() -> None:
    """An integer (quantized) weight is sampled too: bit for bit against one of its own dtype, not at all against a
    floating-point one of the same name (an adapter trained on a 4-bit base goes on the full one)."""
    full = torch.nn.Linear(16, 4)
    quantized = copy.deepcopy(full)
    quantized.weight = torch.nn.Parameter(torch.randint(0, 255, (32, 1), dtype=torch.uint8), requires_grad=False)
    recorded = base_fingerprint(quantized)
    assert recorded["samples"]["weight"]["dtype"] == "uint8"
    assert base_difference(recorded, base_fingerprint(quantized)) is None
    assert base_difference(recorded, base_fingerprint(full)) is None  # packed 4-bit onto float: the bias compared
    with torch.no_grad():
        full.bias.add_(1.0)
    assert base_difference(recorded, base_fingerprint(full)) == "4 of 4 sampled weights differ beyond rounding (bias first)"
    with torch.no_grad():
        quantized.weight.add_(1)
    assert base_difference(recorded, base_fingerprint(quantized)) == \
        "16 of 20 sampled weights differ beyond rounding (weight first)"

    class Packed(torch.nn.Parameter):  # bitsandbytes' 4-bit weight, its bytes stored in a float dtype (quant_storage)
        quant_state = None

    stored_in_float = copy.deepcopy(full)
    stored_in_float.weight = Packed(torch.randn(32, 1), requires_grad=False)
    recorded = base_fingerprint(stored_in_float)
    assert recorded["samples"]["weight"]["packed"] and "packed" not in base_fingerprint(full)["samples"]["weight"]
    assert base_difference(recorded, base_fingerprint(full)) is None  # not compared with the full weight
    assert base_difference(base_fingerprint(full), recorded) is None


def test_trainable_token_rows_are_the_adapters_not_the_bases(tmp_path: Path) -> None:
    """An adapter that trains new token rows (peft's trainable_token_indices, e.g. a mask token) records the embedding
    under its base name, so it loads onto its own base."""
    model = load_student(fixture("dream"))
    peft_model = get_peft_model(model, lora_config(model, r=4, lora_alpha=8, trainable_token_indices=[3]))
    assert any(".trainable_tokens_" in name for name, _ in peft_model.named_parameters())
    assert base_difference(base_fingerprint(peft_model), base_fingerprint(load_student(fixture("dream")))) is None


@pytest.mark.parametrize(("record", "message"), [
    ("{not json", r"is not a record of a base this version reads \(not JSON\); delete it to load on the name check"),
    ('{"format": 2, "samples": {}}', r"reads \(format 2, this version reads 1\); upgrade trims_hf$"),
    ("[1]", r"reads \(format None, this version reads 1\)"),
    ('{"format": 1, "samples": {"model.extra.weight": {"shape": [2], "dtype": "float32", "values": ""}}}',
     r"other weights than .*: its parameters differ \(the recorded base had model\.extra\.weight; this one has "),
    ('{"format": 1, "samples": {"model.extra\\nweight": {"shape": [2], "dtype": "float32", "values": ""}}}',
     r"the recorded base had model\.extra weight; this one has "),  # a name's line break kept off the line
    ('{"format": 1, "samples": "weight"}', r"reads \(ValueError: samples is not a mapping of parameter names"),
    ('{"format": 1, "samples": []}', r"reads \(ValueError: samples is not a mapping of parameter names"),
    ("DTYPE tensor", r"reads \(ValueError: dtype 'tensor'\); delete it"),
    ("DTYPE complex64", r"reads \(ValueError: dtype 'complex64'\); delete it"),
    ("DTYPE float4_e2m1fn_x2", r"reads \(ValueError: dtype 'float4_e2m1fn_x2'\); delete it"),  # packed: no spacing
])
def test_unreadable_or_foreign_base_record_is_one_line(tmp_path: Path, record: str, message: str) -> None:
    native_adapter("llada", tmp_path)
    if record.startswith("DTYPE "):  # the base's own record with one dtype no real one
        samples = base_fingerprint(load_student(fixture("llada")))
        next(iter(samples["samples"].values()))["dtype"] = record.removeprefix("DTYPE ")
        record = json.dumps(samples)
    (tmp_path / BASE_FINGERPRINT).write_text(record)
    with pytest.raises(AdapterError, match=message) as error:
        load_student(fixture("llada"), adapter=str(tmp_path))
    assert "\n" not in str(error.value)


_SHARDED_AFTER_RECORD = """
import sys
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch import nn
from torch.distributed.fsdp import fully_shard
from trims_hf.students.adapters import training_base_fingerprint

dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
model = get_peft_model(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)), LoraConfig(target_modules=["0"], r=2))
before = training_base_fingerprint(model)
print(sorted(before["samples"]) if before else None)
fully_shard(model)  # FSDP2: every weight a DTensor, this process holding its shard
print(training_base_fingerprint(model))
dist.destroy_process_group()
"""


@pytest.mark.slow  # a subprocess launch with a process group
def test_a_model_sharded_by_fsdp_records_no_base(tmp_path: Path) -> None:
    """What the trainer records is taken before FSDP shards the model; a model that comes sharded (DTensor
    weights) records nothing rather than a sample of one shard. In a process of its own: a process group."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _SHARDED_AFTER_RECORD, str(tmp_path / "store")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    # Before: every base weight, under its base name; after: nothing.
    assert result.stdout.splitlines() == ["['0.bias', '0.weight', '1.bias', '1.weight']", "None"]


def test_adapter_of_other_shapes_or_modules_fails_naming_the_keys(tmp_path: Path) -> None:
    original_adapter(tmp_path, ["q_proj"])
    tensors = load_file(tmp_path / "adapter_model.safetensors")
    key = "base_model.model.model.transformer.blocks.0.q_proj.lora_A.weight"
    save_file({**tensors, key: torch.zeros(4, 32)}, tmp_path / "adapter_model.safetensors")
    with pytest.raises(AdapterError, match=r"do not fit.*blocks\.0\.q_proj\.lora_A"):
        load_student(fixture("llada"), adapter=str(tmp_path))
    stray = "base_model.model.model.transformer.blocks.0.gate.lora_A.weight"
    save_file({**tensors, stray: torch.zeros(4, 64)}, tmp_path / "adapter_model.safetensors")
    with pytest.raises(AdapterError, match=r"name no module.*blocks\.0\.gate\.lora_A"):
        load_student(fixture("llada"), adapter=str(tmp_path))


def test_merged_export_is_the_original_layout_with_our_logits(tmp_path: Path) -> None:
    ours = native_adapter("llada", tmp_path / "native")
    assert cli(["export", "--model", fixture("llada"), "--adapter", str(tmp_path / "native"), "--output",
                str(tmp_path / "merged")]) == 0
    assert set(load_file(tmp_path / "merged" / "model.safetensors")) == set(
        load_file(Path(fixture("llada")) / "model.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(load_reference(str(tmp_path / "merged"), "llada")(input_ids("llada")), ours,
                                   atol=1e-4, rtol=1e-4)
    card = (tmp_path / "merged" / "README.md").read_text()
    assert "\n# merged\n" in card  # the folder's name heads the card, the path is what loads it
    assert "trust_remote_code=True" in card and f'load_student("{tmp_path / "merged"}")' in card


@needs_deepspeed
@pytest.mark.slow
def test_an_export_card_shows_the_original_code_only_for_an_original_checkpoint(saved_student, tmp_path: Path) -> None:
    assert base_is_original(fixture("llada")) and not base_is_original(saved_student)
    for original_layout in (True, False):
        card = export_card(fixture("llada"), "me/adapter", tmp_path, "adapter", original_layout=original_layout).text
        assert ("## Load with the original code" in card) is original_layout
        assert ("original model's module names" in card) is original_layout
        assert 'load_student("' in card


@pytest.mark.slow  # a process of its own
def test_a_merged_export_without_an_accelerator_prints_nothing_of_deepspeed(saved_student, tmp_path: Path) -> None:
    """Saving the merged model with transformers (a student in transformers' layout) asks accelerate to unwrap it,
    which imports DeepSpeed where it is installed; DeepSpeed left to guess its accelerator prints that it found no GPU.
    The export names it first, so a machine without an accelerator gets no such line (a process of its own: DeepSpeed
    reads the setting when it is first imported)."""
    student = load_student(saved_student)
    get_peft_model(student, lora_config(student, r=4)).save_pretrained(tmp_path / "native")
    env = {name: value for name, value in os.environ.items() if name != "DS_ACCELERATOR"}
    done = subprocess.run([sys.executable, "-m", "trims_hf.cli", "export", "--model", saved_student, "--adapter",
                           str(tmp_path / "native"), "--output", str(tmp_path / "merged")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and (tmp_path / "merged" / "model.safetensors").is_file(), done.stderr[-2000:]
    if not torch.accelerator.is_available():  # where DeepSpeed finds one, it has nothing to say
        assert "unable to detect" not in done.stdout + done.stderr


def test_lora_wrapping_drops_peft_reading_the_renamed_checkpointing_attribute_and_no_other_warning(monkeypatch):
    """peft reads a model's ``is_gradient_checkpointing``, which transformers 5 renamed and warns about on each read:
    the library's LoRA wrapping leaves that one FutureWarning out and lets every other warning through."""
    import peft

    from trims_hf.students import get_lora_model
    from trims_hf.students.adapters import PEFT_READS_A_RENAMED_ATTRIBUTE

    def wrapped(wrap) -> list[str]:
        student = load_student(fixture("llada"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrap(student, lora_config(student, r=4))
        return [f"{w.category.__name__}: {w.message}" for w in caught]

    renamed = f"FutureWarning: {PEFT_READS_A_RENAMED_ATTRIBUTE}"
    assert any(w.startswith(renamed) for w in wrapped(get_peft_model))  # peft's own call warns
    assert not any(w.startswith(renamed) for w in wrapped(get_lora_model))

    def also_warns(model, config):
        warnings.warn("another library's warning", UserWarning, stacklevel=2)
        return get_peft_model(model, config)

    monkeypatch.setattr(peft, "get_peft_model", also_warns)
    assert wrapped(get_lora_model) == ["UserWarning: another library's warning"]
    for category, text in ((FutureWarning, "another deprecation"), (UserWarning, PEFT_READS_A_RENAMED_ATTRIBUTE)):
        def warns(model, config, category=category, text=text):
            warnings.warn(text, category, stacklevel=2)
            return get_peft_model(model, config)

        monkeypatch.setattr(peft, "get_peft_model", warns)
        assert wrapped(get_lora_model) == [f"{category.__name__}: {text}"]


def test_push_to_hub_uploads_the_export_with_its_card(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trims_hf.commands.export  # noqa: F401 - the command's module, whose push is patched below
    import trims_hf.exporting as export_module
    from trims_hf.data import hub

    calls: list[tuple[str, dict]] = []

    class FakeApi:
        def __init__(self, token: str | None = None) -> None:
            pass

        def create_repo(self, repo_id: str, **kwargs: object) -> None:
            calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

        def upload_folder(self, **kwargs: object) -> str:
            calls.append(("upload_folder", {**kwargs, "files": sorted(p.name for p in Path(kwargs["folder_path"]).iterdir())}))
            return "https://huggingface.co/me/llada-trims/commit/0"

    monkeypatch.setattr(export_module, "HfApi", FakeApi)
    monkeypatch.setattr(hub, "check_push_access", lambda repo_id, token=None: "me")
    native_adapter("llada", tmp_path / "native")
    assert cli(["export", "--model", fixture("llada"), "--adapter", str(tmp_path / "native"), "--output",
                str(tmp_path / "out"), "--format", "adapter", "--push-to-hub", "me/llada-trims"]) == 0
    assert calls[0] == ("create_repo", {"repo_id": "me/llada-trims", "exist_ok": True})
    assert calls[1][1]["repo_id"] == "me/llada-trims"
    assert calls[1][1]["files"] == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "base_model:" in card and 'PeftModel.from_pretrained(base, "me/llada-trims")' in card
    assert 'load_student("' + fixture("llada") + '", adapter="me/llada-trims")' in card


@pytest.fixture
def plain_llama(tokenizer, tmp_path: Path) -> str:
    """A plain Llama checkpoint (its config names no student family), as a user's own causal LM is saved."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    return str(tmp_path / "llama")


@pytest.fixture
def plain_llama_adapter(plain_llama: str, tmp_path: Path) -> str:
    """An adapter trained on the plain Llama as a LLaDA-style student (``trims train --model_kind llada``)."""
    student = load_student(plain_llama, "llada")
    get_peft_model(student, lora_config(student, r=4)).save_pretrained(tmp_path / "adapter")
    return str(tmp_path / "adapter")


def test_plain_causal_lm_student_exports_with_model_kind(plain_llama, plain_llama_adapter, tmp_path, capsys):
    export = ["export", "--model", plain_llama, "--adapter", plain_llama_adapter, "--output"]
    assert cli([*export, str(tmp_path / "unsaid")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --model {plain_llama} is a plain causal LM ('llama'); say how it was trained as a diffusion student: "
        "--model-kind llada (logits unshifted) or --model-kind dream (logits shifted by one)."]
    assert not (tmp_path / "unsaid").exists()
    assert cli([*export, str(tmp_path / "merged"), "--model-kind", "llada"]) == 0
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    card = (tmp_path / "merged" / "README.md").read_text()  # no original code reads it: only trims_hf's way is shown
    assert "transformers' own layout" in card and "trust_remote_code" not in card and "load_student(" in card
    base_tokenizer = AutoTokenizer.from_pretrained(plain_llama)  # a merged folder loads on its own: the base's tokenizer
    assert AutoTokenizer.from_pretrained(tmp_path / "merged").get_vocab() == base_tokenizer.get_vocab()
    trained = tmp_path / "run"  # trims train's output folder: the adapter beside the student's tokenizer, which wins
    shutil.copytree(plain_llama_adapter, trained)
    base_tokenizer.add_special_tokens({"additional_special_tokens": ["<|trained|>"]})
    base_tokenizer.save_pretrained(trained)
    assert cli(["export", "--model", plain_llama, "--adapter", str(trained), "--output", str(tmp_path / "merged-run"),
                "--model-kind", "llada"]) == 0
    assert "<|trained|>" in AutoTokenizer.from_pretrained(tmp_path / "merged-run").get_vocab()
    (tmp_path / "empty").mkdir()  # new or empty, as --help says
    assert cli([*export, str(tmp_path / "empty"), "--model-kind", "llada", "--format", "adapter"]) == 0
    # the base has no original layout: the adapter keeps the names of the model it goes on
    assert set(load_file(tmp_path / "empty" / "adapter_model.safetensors")) == set(
        load_file(Path(plain_llama_adapter) / "adapter_model.safetensors"))


@pytest.mark.parametrize("argv,expected", [
    (["--output", "{w}/full"], "--output {w}/full is not empty (notes.txt); choose a new folder, delete it or pass "
                               "--overwrite."),
    (["--model", "{w}/nope"], "--model {w}/nope: no such file or folder."),
    (["--adapter", "{w}/nope"], "--adapter {w}/nope: no such file or folder."),
    (["--token", "abc"], "--token: only --push-to-hub reads it; drop it, or pass --push-to-hub REPO."),
    (["--output", "{model}", "--overwrite", ""], "--output {model} is --model {model}, a model it is made from; "
                                                     "write it to a folder apart."),
    (["--output", "{adapter}", "--overwrite", "", "--format", "adapter"],
     "--output {adapter} is --adapter {adapter}, a model it is made from; write it to a folder apart."),
])
def test_export_mistakes_are_one_line_in_the_commands_terms_before_any_model_loads(
        argv, expected, plain_llama, plain_llama_adapter, tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the export ran before its inputs were checked")

    monkeypatch.setattr("trims_hf.exporting.export", never)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("")
    given = dict(zip(argv[::2], argv[1::2]))
    flags = {"--model": plain_llama, "--adapter": plain_llama_adapter, "--output": "{w}/out", "--model-kind": "llada",
             **given}
    names = {"w": tmp_path, "model": plain_llama, "adapter": plain_llama_adapter}
    inputs = {path: path.read_bytes() for folder in (plain_llama, plain_llama_adapter) for path in Path(folder).iterdir()}
    assert cli(["export", *(arg.format(**names) for pair in flags.items() for arg in pair if arg)]) == 2  # "": a switch
    assert capsys.readouterr().err.splitlines() == [f"error: {expected.format(**names)}"]
    assert not (tmp_path / "out").exists()
    assert {path: path.read_bytes() for path in inputs} == inputs
