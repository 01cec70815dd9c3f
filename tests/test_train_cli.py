"""``trims train``: the toy recipe end to end, overrides, unknown keys, the paper recipes, resume reproducibility.

Run as a script to build the toy recipe's inputs: ``python tests/test_train_cli.py outputs/toy``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import synthetic_scored_rows
from datasets import Dataset
from helpers_tokenizers import make_tokenizer
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig

from trims_hf import MDLMConfig
from trims_hf.cli import main
from trims_hf.commands import ALLOCATOR_SETTINGS
from trims_hf.commands.recipe import override_keys, parse_recipe, read_recipe
from trims_hf.commands.train import parser as train_parser
from trims_hf.errors import InputError
from trims_hf.students.adapters import BASE_FINGERPRINT
from trims_hf.training.train_job import RUN_FILE, check_overrides_read
from trims_hf.training.trainer import MDLMTrainer

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TOY = RECIPES / "toy" / "trims_toy.yaml"


def arithmetic_rows(count: int = 64) -> list[dict]:
    """Self-contained toy prompts and completions (no data set download)."""
    rows = []
    for i in range(count):
        a, b = 3 * i % 17 + 2, 7 * i % 23 + 1
        rows.append({"prompt": f"What is {a} plus {b}?", "completion": f"{a} plus {b} is {a + b}. The answer is {a + b}."})
    return rows


def write_toy_assets(folder: Path) -> tuple[Path, Path]:
    """Write the toy student (tokenizer + tiny Llama config, no weights) and a scored data set folder."""
    rows = arithmetic_rows()
    tokenizer = make_tokenizer([r["prompt"] + "\n" + r["completion"] for r in rows], vocab_size=300)
    student = folder / "student"
    LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id).save_pretrained(student)
    tokenizer.save_pretrained(student)
    scored = folder / "scored"
    (scored / "data").mkdir(parents=True, exist_ok=True)
    Dataset.from_list(synthetic_scored_rows(rows, tokenizer)).to_parquet(str(scored / "data" / "train-00000-of-00001.parquet"))
    return student, scored


@pytest.fixture(scope="module")
def toy_inputs(tmp_path_factory) -> dict[str, str]:
    """Overrides pointing the toy recipe at freshly written inputs, by key."""
    student, scored = write_toy_assets(tmp_path_factory.mktemp("toy"))
    return {"model_name_or_path": str(student), "dataset_name": str(scored), "init_from_config": "true", "model_kind": "llada"}


@pytest.fixture(scope="module")
def toy(toy_inputs) -> list[str]:
    return [arg for key, value in toy_inputs.items() for arg in (f"--{key}", value)]


def train_cli(toy: list[str], output_dir: Path, *overrides: str) -> int:
    return main(["train", "--config", str(TOY), *toy, "--output_dir", str(output_dir), *overrides])


@pytest.mark.slow
def test_toy_recipe_end_to_end(tmp_path, toy):
    assert train_cli(toy, tmp_path, "--max_steps", "3") == 0
    assert (tmp_path / "adapter_model.safetensors").exists() and (tmp_path / "adapter_config.json").exists()
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert state["global_step"] == 3 and len(losses) == 3 and all(loss > 0 for loss in losses)
    card = (tmp_path / "README.md").read_text()
    assert "library_name: peft" in card and "trajectory_ratio" in card
    positions = json.loads((Path(toy[toy.index("--model_name_or_path") + 1]) / "config.json").read_text())[
        "max_position_embeddings"]
    gen_length = int(re.search(r"--gen-length (\d+) ", card)[1])  # the suggested evaluation leaves room for a prompt
    assert 2 * gen_length <= positions
    assert (tmp_path / BASE_FINGERPRINT).is_file()  # the base's weights as training read them (here random ones)


def test_overrides_win_and_are_typed():
    model_args, data_args, args = parse_recipe(TOY, ["--num_buckets", "4", "--bucket_ordering", "easy_to_hard",
                                                     "--lora_r", "4", "--metric", "entropy"])
    assert (args.num_buckets, args.bucket_ordering, model_args.lora_r, args.metric) == (4, "easy_to_hard", 4, "entropy")
    assert args.learning_rate == pytest.approx(3e-3) and args.lr_scheduler_type == "cosine"  # from the YAML
    assert not model_args.init_from_config and data_args.dataset_name == "outputs/toy/score/scored"


@pytest.mark.parametrize("spelling", [["--global_batch_size", "null"], ["--global-batch-size=null"]])
def test_null_on_the_command_line_unsets_a_key_that_may_be_unset(spelling):
    """``--key null`` is YAML's ``key: null`` for a key whose value may be unset; for any other key it stays a value."""
    recipe = RECIPES / "llada" / "trims_s1k.yaml"
    _, _, args = parse_recipe(recipe, [*spelling, "--per_device_train_batch_size", "4", "--bf16", "false",
                                       "--use_cpu", "true"])
    assert args.global_batch_size is None and args.per_device_train_batch_size == 4
    with pytest.raises(InputError, match=r"^--lora_r: invalid int value: 'null'"):
        parse_recipe(recipe, ["--lora_r", "null", "--bf16", "false", "--use_cpu", "true"])
    base = ["--bf16", "false", "--use_cpu", "true"]
    last = {"null last": (["--global_batch_size", "16", *spelling, "--per_device_train_batch_size", "4"], None),
            "16 last": ([*spelling, "--global_batch_size=16"], 16), "yaml tilde": (["--global_batch_size", "~"], None)}
    for argv, expected in last.values():  # the last one given wins, as argparse has it
        given = [*base, *argv] + (["--per_device_train_batch_size", "4"] if expected is None and "4" not in argv else [])
        assert parse_recipe(recipe, given)[2].global_batch_size == expected
    assert parse_recipe(recipe, [*base, "--run_name", "null"])[2].run_name == "null"  # a text key keeps the text


@pytest.mark.parametrize("settings,match", [
    ({"per_device_train_batch_size": 0}, r"^per_device_train_batch_size=0: must be at least 1\.$"),
    ({"per_device_eval_batch_size": -1}, r"^per_device_eval_batch_size=-1: must be at least 1\.$"),
    ({"learning_rate": float("nan")}, r"^learning_rate=nan: must be a finite number > 0"),
    ({"learning_rate": 0.0}, r"^learning_rate=0\.0: must be a finite number > 0 \(0 would train nothing\)"),
    ({"num_train_epochs": 0, "max_steps": -1}, r"^num_train_epochs=0: must be a finite number > 0 unless max_steps > 0"),
    ({"loss_normalization": "bogus"}, r"^loss_normalization='bogus': choose token or sequence\.$"),
    ({"num_train_epochs": float("inf")}, r"^num_train_epochs=inf: must be a finite number > 0"),
    ({"adam_beta1": 1.0}, r"^adam_beta1=1\.0: must be in \[0, 1\)\.$"),
    ({"adam_beta2": -0.1}, r"^adam_beta2=-0\.1: must be in \[0, 1\)\.$"),
    ({"adam_epsilon": -1e-8}, r"^adam_epsilon=-1e-08: must be a finite number >= 0\.$"),
    ({"label_smoothing_factor": 0.1}, r"^label_smoothing_factor=0\.1: the MDLM loss has no label smoothing"),
])
def test_mdlm_config_refuses_what_training_would_fail_on_or_train_nothing_with(settings, match):
    with pytest.raises(ValueError, match=match):
        MDLMConfig(report_to="none", **settings)
    assert MDLMConfig(report_to="none", num_train_epochs=0, max_steps=3).max_steps == 3  # max_steps decides


@pytest.mark.parametrize("name", ["bf16", "bf16_full_eval"])
def test_bf16_without_a_bf16_gpu_names_the_setting_and_both_ways_out(name, monkeypatch):
    """Said before transformers' own refusal, which names neither the setting nor fp32; with use_cpu it trains."""
    monkeypatch.setattr("transformers.utils.is_torch_bf16_gpu_available", lambda: False)
    expected = (rf"^{name}=True: this machine has no GPU that computes in bf16; set {name}=False to run here without "
                r"bf16 mixed precision \(the weights keep the dtype they load in\), or use_cpu=True to run in bf16 on the "
                r"CPU\.$")
    with pytest.raises(ValueError, match=expected):
        MDLMConfig(report_to="none", **{name: True})
    assert getattr(MDLMConfig(report_to="none", use_cpu=True, **{name: True}), name)


@pytest.mark.parametrize("settings,match", [
    ({"compile_blocks": "no"}, r"^compile_blocks='no': must be true or false \(a bool\), not str\.$"),
    ({"global_batch_size": 2.5}, r"^global_batch_size=2\.5: must be a whole number \(int\), not float\.$"),
    ({"per_device_train_batch_size": "8"}, r"^per_device_train_batch_size='8': must be a whole number"),
])
def test_mdlm_config_names_a_setting_of_the_wrong_type(settings, match):
    """A string or a fraction given in Python would otherwise pass a truth test or fail in a division far from it."""
    with pytest.raises(TypeError, match=match):
        MDLMConfig(report_to="none", **settings)


def test_recipe_values_are_parser_defaults_typed_as_on_the_command_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: m\ndataset_name: d\nlearning_rate: 1e-4\nuse_lora: false\nlora_r: 8\n"
                      "lora_target_modules: q_proj\nend_of_response: [a, b]\ndecode_eval_decoding: {threshold: 0.5}\n")
    model_args, data_args, args = parse_recipe(recipe, ["--lora_r", "16", "--use_lora"])
    assert args.learning_rate == 1e-4 and isinstance(args.learning_rate, float)  # YAML 1.1 reads 1e-4 as text
    assert (model_args.use_lora, model_args.lora_r, model_args.lora_target_modules) == (True, 16, ["q_proj"])
    assert args.end_of_response == ["a", "b"] and data_args.decoding_config().threshold == 0.5
    assert parse_recipe(recipe, ["--model", "other"])[0].model_name_or_path == "other"  # trims eval's spelling too


def test_unknown_keys_are_errors(tmp_path, toy, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TOY.read_text() + "lerning_rate: 0.1\n")
    with pytest.raises(InputError, match=r"bad\.yaml: unknown key\(s\) 'lerning_rate' \(did you mean learning_rate\?\)"):
        read_recipe(bad)
    assert main(["train", "--config", str(bad)]) == 2
    assert "lerning_rate" in capsys.readouterr().err
    assert train_cli(toy, tmp_path / "out", "--num_bukets", "4") == 2
    assert "--num_bukets: no such recipe key (did you mean --num_buckets?)" in capsys.readouterr().err
    assert train_cli(toy, tmp_path / "out", "--num_bucket", "4") == 2  # abbreviations never silently set a key
    assert "--num_bucket: no such recipe key" in capsys.readouterr().err


def edit_recipe(key: str, line: str | None) -> Callable[[str], str]:
    """A recipe text edit: replace (or, with ``line=None``, drop) the ``key:`` line; add ``line`` if there was none."""
    def edit(text: str) -> str:
        kept = [row for row in text.splitlines() if not row.startswith(f"{key}:")]
        return "\n".join(kept + ([line] if line else [])) + "\n"
    return edit


UNSCHEDULED = {"eval_split": "train", "eval_strategy": "epoch"}


def without_split(text: str) -> str:
    """The toy recipe without its per-device batch and accumulation lines."""
    return edit_recipe("gradient_accumulation_steps", None)(edit_recipe("per_device_train_batch_size", None)(text))
# id, recipe edit, overrides by key (None: drop the toy's), raw arguments after them ({w}: the workspace), the error
MISTAKES = [
    ("recipe-not-yaml", lambda text: text + "  dtype: float32\n", {}, [],
     r"^--config .*: not valid YAML \(.* at line \d+, column \d+\)\.$"),
    ("recipe-a-list", lambda text: "- a\n- b\n", {}, [], r"a recipe is a YAML mapping of key: value lines, got list\.$"),
    ("recipe-missing-key", edit_recipe("dataset_name", None), {"dataset_name": None}, [],
     r"^.*\.yaml sets no dataset_name: add to the recipe or pass --dataset_name VALUE\.$"),
    ("recipe-bad-int", edit_recipe("num_buckets", "num_buckets: 4.5"), {}, [],
     r"^num_buckets in .*\.yaml: invalid int value: '4.5'$"),
    ("recipe-bad-choice", edit_recipe("metric", "metric: perplexity"), {}, [],
     r"^metric in .*\.yaml: invalid choice: 'perplexity' \(choose from 'nll', 'entropy'\)$"),
    ("recipe-null", edit_recipe("max_length", "max_length: null"), {}, [],
     r"^max_length in .*: null is not allowed; expected int\.$"),
    ("recipe-list-for-scalar", edit_recipe("learning_rate", "learning_rate: [1.0e-3, 1.0e-4]"), {}, [],
     r"^learning_rate in .*: expected one float, got the list \[0\.001, 0\.0001\]\.$"),
    ("unknown-override", None, {}, ["--dataset", "x"], r"^--dataset: no such recipe key \(did you mean --dataset_name\?\)"),
    ("stray-argument", None, {}, ["{w}/scored"], r"^unexpected argument '.*scored': overrides are --key value pairs\.$"),
    ("override-bad-int", None, {}, ["--num_buckets", "four"], r"^--num_buckets: invalid int value: 'four'$"),
    ("override-no-value", None, {}, ["--num_buckets"], r"^--num_buckets: expected one argument$"),
    ("override-bad-choice", None, {"bucket_ordering": "hard-to-easy"}, [],
     r"^--bucket_ordering: invalid choice: 'hard-to-easy' \(choose from 'hard_to_easy', 'easy_to_hard', 'random'\)$"),
    ("override-bad-bool", None, {"use_lora": "maybe"}, [], r"^--use_lora: Truthy value expected: got maybe"),
    ("override-out-of-range", None, {"p_context": "1.5"}, [], r"^p_context=1.5: must be in \[0, 1\]\.$"),
    ("model-missing", None, {"model_name_or_path": "{w}/no-student"}, [],
     r"^model_name_or_path .*no-student: no such file or folder\.$"),
    ("model-folder-without-config", None, {"model_name_or_path": "{w}/scored"}, [],
     r"^model_name_or_path .*scored: the folder has no config\.json\.$"),
    ("model-hub-unreachable", None, {"model_name_or_path": "org/student"}, [],
     r"^model_name_or_path org/student: not a local path, and the Hugging Face Hub is unreachable .*"
     r"pass a local folder to model_name_or_path\.$"),
    ("model-kind-unknown", None, {"model_kind": None}, [],
     r"^model_name_or_path .*student is a plain causal LM \('llama'\); say how it was trained as a diffusion student: "
     r"model_kind llada \(logits unshifted\) or model_kind dream"),
    ("no-mask-token", None, {"model_name_or_path": "{w}/student-no-mask"}, [],
     r"^model_name_or_path .*student-no-mask: no mask token"),
    ("no-tokenizer-in-the-folder", None, {"tokenizer_name_or_path": "{w}/empty"}, [],
     r"^tokenizer_name_or_path .*empty: the folder holds no tokenizer \(tokenizer\.json, tokenizer_config\.json, a "
     r"vocabulary\)\.$"),
    ("another-models-tokenizer", None, {"tokenizer_name_or_path": "{w}/tokenizer-larger"}, [],
     r"^tokenizer_name_or_path .*tokenizer-larger: \d+ tokens, more than the \d+ of the student's vocabulary "
     r"\(model_name_or_path .*\): it is not the student's tokenizer\.$"),
    ("another-models-mask", None, {"tokenizer_name_or_path": "{w}/tokenizer-other-mask"}, [],
     r"^tokenizer_name_or_path .*tokenizer-other-mask: its mask token is id \d+, the student's is \d+ "
     r"\(model_name_or_path .*'s config\): it is not the student's tokenizer \(or set mask_token_id\)\.$"),
    ("data-missing", None, {"dataset_name": "{w}/rows.jsonl"}, [], r"^dataset_name .*rows\.jsonl: no such file or folder\.$"),
    ("data-csv", None, {"dataset_name": "{w}/rows.csv"}, [], r"^dataset_name .*rows\.csv: unsupported file type '\.csv'"),
    ("data-hub-unreachable", None, {"dataset_name": "org/s1k-scored"}, [],
     r"^dataset_name org/s1k-scored: not a local path, and the Hugging Face Hub is unreachable .*local \.jsonl/\.json/\.parquet"),
    ("data-wrong-columns", None, {"dataset_name": "{w}/gsm8k.jsonl"}, [],
     r"^dataset_name .*gsm8k\.jsonl: no 'prompt' and 'completion' \(or 'messages'\) columns, only question, answer; "),
    ("data-unscored", None, {"dataset_name": "{w}/plain.jsonl"}, [],
     r"^dataset_name .*plain\.jsonl: no teacher scores for metric nll .*set trajectory_ratio 0"),
    ("data-file-with-eval-split", None, {"dataset_name": "{w}/plain.jsonl", "eval_split": "test"}, [],
     r"^dataset_name .*plain\.jsonl is a single file, whose one split is 'train'; got split='test'\.$"),
    ("data-unknown-split", None, {"eval_split": "test"}, [], r"^dataset_name .*scored has no split='test' \(Unknown split"),
    ("data-empty-folder", None, {"dataset_name": "{w}/empty"}, [],
     r"^dataset_name .*empty: no data files in the folder \(\.parquet, \.jsonl, \.json, \.csv, \.\.\.\)\.$"),
    ("data-no-rows", None, {"dataset_name": "{w}/no-rows.parquet"}, [], r"^dataset_name .*no-rows\.parquet: no rows\.$"),
    ("data-empty-file", None, {"dataset_name": "{w}/empty.jsonl"}, [], r"^dataset_name .*empty\.jsonl: no rows\.$"),
    ("prompt-longer-than-max-length", None, {"max_length": "3"}, [],
     (r"^dataset_name .*scored, train_split train: row 0: the prompt has \d+ tokens, leaving no room for the completion "
      r"within max_length=3\.$")),
    ("max-length-above-positions", None, {"max_length": "512"}, [],
     (r"^max_length=512: more than the 256 positions of the student \(max_position_embeddings\); set it to at most 256 "
      r"\(model_name_or_path .*student\)\.$")),
    ("scores-of-different-lengths", None, {"dataset_name": "{w}/bad-lengths.parquet"}, [],
     (r"^dataset_name .*bad-lengths\.parquet, train_split train: row 1: per-token fields have different lengths "
      r"\{'teacher_token_start': \d+, 'teacher_token_end': \d+, 'teacher_nll': \d+, ")),
    ("scores-negative-nll", None, {"dataset_name": "{w}/bad-negative.parquet"}, [],
     (r"^dataset_name .*, train_split train: row 1: field 'teacher_nll' has -0\.5 at token 2; a teacher score is a "
      r"finite number >= 0\.$")),
    ("scores-nan-nll", None, {"dataset_name": "{w}/bad-nan.parquet"}, [],
     r"^dataset_name .*, train_split train: row 1: field 'teacher_nll' has nan at token 2; a teacher score"),
    ("scores-bucket-out-of-range", None, {"dataset_name": "{w}/bad-bucket.parquet"}, [],
     (r"^dataset_name .*, train_split train: row 1: field 'teacher_bucket' has -1 at token 0; a bucket id is a whole "
      r"number in \[0, 127\)\.$")),
    ("spans-out-of-order", None, {"dataset_name": "{w}/bad-order.parquet"}, [],
     r"^dataset_name .*, train_split train: row 1: fields 'teacher_token_start' / 'teacher_token_end': teacher span 2 "),
    ("span-outside-the-completion", None, {"dataset_name": "{w}/bad-outside.parquet"}, [],
     (r"^dataset_name .*, train_split train: row 1: fields 'teacher_token_start' / 'teacher_token_end': teacher span \d+ "
      r"= \[\d+, \d+\) does not match the completion text \(length \d+,")),
    ("output-inside-the-data", None, {"output_dir": "{w}/scored/run"}, [],
     r"^output_dir .*/scored/run lies inside dataset_name .*/scored, the data it is made from; write it to a folder "
     r"apart\.$"),
    ("span-at-a-fraction", None, {"dataset_name": "{w}/bad-fraction.parquet"}, [],
     r"^dataset_name .*, train_split train: row 1: fields 'teacher_token_start' / 'teacher_token_end': teacher span 1 "
     r"= \[0\.5, \d+(\.0)?\); a span's ends are character offsets, whole numbers\.$"),
    ("system-prompt-plain-format", None, {"system_prompt": "hi", "prompt_format": "plain"}, [],
     r"^system_prompt goes into the chat template, and prompt_format='plain' renders none; drop system_prompt, or use "
     r"prompt_format='chat_template'\.$"),
    ("system-prompt-no-chat-template", None, {"system_prompt": "hi", "model_name_or_path": "{w}/student-no-template"}, [],
     r"^system_prompt goes into the chat template, and the tokenizer has none \(prompt_format='chat_template' renders "
     r"plain text with it\); drop system_prompt\.$"),
    ("prompt-not-a-text", None, {"dataset_name": "{w}/number-prompt.jsonl", "trajectory_ratio": "0"}, [],
     (r"^dataset_name .*number-prompt\.jsonl, train_split train: row 0: field 'prompt' is 5; a prompt is a text or a "
      r"list of chat messages \{role, content\}\.$")),
    ("output-is-a-file", None, {"output_dir": "{w}/a-file"}, [], r"^output_dir .*a-file: a file, not a folder\.$"),
    ("output-under-a-file", None, {"output_dir": "{w}/a-file/run"}, [],
     r"^output_dir .*run: .*a-file is a file, not a folder\.$"),
    ("output-not-empty", None, {"output_dir": "{w}/earlier-run"}, [],
     r"^output_dir .*earlier-run is not empty \(checkpoint-3, notes\.txt\); .*--resume_from_checkpoint true\.$"),
    ("output-not-empty-no-checkpoint", None, {"output_dir": "{w}/other-files"}, [],  # nothing to resume: not advised
     r"^output_dir .*other-files is not empty \(notes\.txt\); [^-]*$"),
    ("global-batch-above-the-rows", None, {"per_device_train_batch_size": "null", "gradient_accumulation_steps": "null",
                                           "global_batch_size": "128", "padding": "max_length"}, [],
     r"^global batch 128 \(global_batch_size, .* x 1 processes\) is more than the 64 training rows of .*scored: each "
     r"optimizer step would see 64; choose at most 64\.$"),
    ("split-above-the-rows", None, {"per_device_train_batch_size": "40", "gradient_accumulation_steps": "2"}, [],
     r"^global batch 80 .* is more than the 64 training rows"),
    ("lora-settings-without-lora", None, {"use_lora": "false", "lora_r": "4", "lora_dropout": "0.2"}, [],
     r"^lora_r=4, lora_dropout=0\.2: only a LoRA run reads them, and use_lora=false trains every weight; drop them, "),
    ("trajectory-settings-without-trajectories", None, {"trajectory_ratio": "0", "p_future": "0.5"}, [],
     r"^p_future=0\.5: only trajectory samples read it, and trajectory_ratio=0 \(the MDLM baseline\) draws none; "),
    ("bucket-seed-without-random-ordering", None, {"bucket_seed": "3"}, [],
     r"^bucket_seed=3 seeds the random ordering only, and bucket_ordering is hard_to_easy; drop bucket_seed, or set "),
    ("searched-split-with-longest-padding", None, {"per_device_train_batch_size": "null",
                                                   "gradient_accumulation_steps": "null", "global_batch_size": "16",
                                                   "padding": "longest"}, [],
     r"^global_batch_size 16 with padding=longest: the split it chooses would change the loss "),
    ("seed-negative", None, {"seed": "-1"}, [], r"^seed=-1: must be in \[0, 4294967295\]\.$"),
    ("max-steps-zero", None, {"max_steps": "0"}, [],
     r"^max_steps=0: a number of optimizer steps > 0, or -1 \(the default\) to train num_train_epochs\.$"),
    ("max-steps-negative", None, {"max_steps": "-5"}, [], r"^max_steps=-5: a number of optimizer steps > 0, or -1 "),
    ("max-grad-norm-nan", None, {"max_grad_norm": "nan"}, [], r"^max_grad_norm=nan: must be a finite number >= 0 "),
    ("weight-decay-negative", None, {"weight_decay": "-1"}, [], r"^weight_decay=-1\.0: must be a finite number >= 0\.$"),
    ("epochs-infinite", None, {"num_train_epochs": "inf"}, [], r"^num_train_epochs=inf: must be a finite number > 0 "),
    ("adam-beta1-above-one", None, {"adam_beta1": "1.5"}, [], r"^adam_beta1=1\.5: must be in \[0, 1\)\.$"),
    ("adam-beta2-nan", None, {"adam_beta2": "nan"}, [], r"^adam_beta2=nan: must be in \[0, 1\)\.$"),
    ("adam-epsilon-nan", None, {"adam_epsilon": "nan"}, [], r"^adam_epsilon=nan: must be a finite number >= 0\.$"),
    ("label-smoothing", None, {"label_smoothing_factor": "0.1"}, [],
     r"^label_smoothing_factor=0\.1: the MDLM loss has no label smoothing, so it would change nothing; leave it at 0\.$"),
    ("bucket-seed-negative", None, {"bucket_seed": "-1"}, [], r"^bucket_seed=-1: must be in \[0, 4294967295\]\.$"),
    ("resume-nothing", None, {"output_dir": "{w}/empty", "resume_from_checkpoint": "true"}, [],
     r"^resume_from_checkpoint true: output_dir .*empty holds no checkpoint-N folder\.$"),
    ("resume-not-a-checkpoint", None, {"resume_from_checkpoint": "{w}/earlier-run/checkpoint-3"}, [],
     r"^resume_from_checkpoint .*checkpoint-3: not a checkpoint folder \(no trainer_state\.json\)\.$"),
    ("push-no-token", None, {"push_to_hub": "true", "hub_model_id": "me/toy-trims"}, [],
     r"^Cannot push to me/toy-trims: no Hugging Face token"),
    ("decode-eval-unscheduled", None, {"decode_eval_task": "gsm8k"}, [],
     r"^decode_eval_task runs at each evaluation: set eval_split"),
    ("decode-eval-unknown-task", None, {"decode_eval_task": "gsm9k", **UNSCHEDULED}, [],
     r"^decode_eval_task gsm9k: unknown task 'gsm9k'; known tasks: gsm8k"),
    ("decode-eval-code-task", None, {"decode_eval_task": "mbpp", **UNSCHEDULED}, [],
     r"^decode_eval_task mbpp: its grading runs model-written code"),
    ("decode-eval-missing-file", None,
     {"decode_eval_task": "gsm8k", **UNSCHEDULED, "decode_eval_data_file": "{w}/test.jsonl"}, [],
     r"^decode_eval_data_file .*test\.jsonl: no such file\.$"),
    ("decode-eval-hub-unreachable", None, {"decode_eval_task": "gsm8k", **UNSCHEDULED}, [],
     r"^decode_eval_data_file openai/gsm8k \(the default\): not a local path, and the Hugging Face Hub is unreachable"),
    ("decode-eval-threshold", None, {"decode_eval_decoding": "{{threshold: 1.5}}"}, [],
     r"^decode_eval_decoding: threshold=1.5: must be in \[0, 1\]\.$"),
    ("decode-eval-bad-setting", None, {"decode_eval_decoding": "{{treshold: 0.5}}"}, [],
     r"^decode_eval_decoding: unknown decoder setting\(s\) treshold; known: "),
    ("decode-eval-past-the-positions", None,
     {"decode_eval_task": "gsm8k", **UNSCHEDULED, "decode_eval_data_file": "{w}/gsm8k.jsonl",
      "decode_eval_decoding": "{{gen_length: 4096, block_length: 32}}"}, [],
     r"^decode_eval_task gsm8k: problem 0: gen_length=4096 after a prompt of \d+ tokens reaches position \d+, past the "
     r"model's max_position_embeddings=\d+; set a smaller gen_length in decode_eval_decoding"),
    ("global-batch-zero", None, {"global_batch_size": "0"}, [], r"^global_batch_size 0: must be at least 1\.$"),
    ("global-batch-and-split", None, {"global_batch_size": "32", "gradient_accumulation_steps": "2"}, [],
     r"^global_batch_size 32 chooses per_device_train_batch_size and gradient_accumulation_steps itself \(the largest "
     r"per-device batch that fits\); give one or the other \(global_batch_size: null in a recipe or "
     r"--global_batch_size null on the command line, or leave "),
    ("global-batch-and-default-split", without_split, {"global_batch_size": "32", "per_device_train_batch_size": "8"}, [],
     r"^global_batch_size 32 chooses per_device_train_batch_size itself "),  # transformers' default, given: refused
    ("batch-size-zero", None, {"per_device_train_batch_size": "0"}, [],
     r"^per_device_train_batch_size=0: must be at least 1\.$"),
    ("batch-size-negative", None, {"per_device_train_batch_size": "-3"}, [],
     r"^per_device_train_batch_size=-3: must be at least 1\.$"),
    ("accumulation-zero", None, {"gradient_accumulation_steps": "0"}, [],
     r"^gradient_accumulation_steps=0: must be at least 1\.$"),
    ("learning-rate-negative", None, {"learning_rate": "-1"}, [],
     r"^learning_rate=-1\.0: must be a finite number > 0 \(0 would train nothing\)\.$"),
    ("no-epochs", None, {"num_train_epochs": "0"}, [],
     r"^num_train_epochs=0\.0: must be a finite number > 0 unless max_steps > 0 .*0 would train nothing\.$"),
    ("lora-rank-zero", None, {"lora_r": "0"}, [], r"^lora_r=0: the adapter's rank must be at least 1\.$"),
    ("lora-rank-negative", None, {"lora_r": "-4"}, [], r"^lora_r=-4: the adapter's rank must be at least 1\.$"),
    ("lora-alpha-zero", None, {"lora_alpha": "0"}, [], r"^lora_alpha=0: must be > 0 "),
    ("lora-dropout-above-one", None, {"lora_dropout": "2"}, [], r"^lora_dropout=2\.0: must be in \[0, 1\)\.$"),
    ("recipe-lora-targets-a-mapping", edit_recipe("lora_target_modules", "lora_target_modules: {a: 1}"), {}, [],
     r"^lora_target_modules in .*\.yaml: expected a list of str, got \{'a': 1\}\.$"),
    ("recipe-repeated-key", lambda text: text + "num_buckets: 4\n", {}, [],
     r"^--config .*\.yaml: key 'num_buckets' is set twice \(lines \d+ and \d+\); keep one\.$"),
    ("end-of-response-not-a-token", None, {"end_of_response": "<notatoken>"}, [],
     r"^end_of_response: End-of-response token '<notatoken>' is not a single token of the student tokenizer\.$"),
    ("end-of-response-a-written-list", None, {"end_of_response": '["<eos>"]'}, [],
     r"^end_of_response: End-of-response token '\[\"<eos>\"\]' is not a single token of the student tokenizer; on the "
     r"command line a list is its items apart \(--end_of_response <eos> <\|endoftext\|>\)\.$"),
    ("p-future-zero", None, {"p_future": "0"}, [], r"^p_future=0\.0: trajectory samples would mask nothing"),
    ("inverted-trajectory-rates", None, {"p_context": "0.99", "p_future": "0.01"}, [],
     r"^p_context=0\.99 above p_future=0\.01: .*swap them\.$"),
    ("negative-dataloader-workers", None, {"dataloader_num_workers": "-1"}, [],
     r"^dataloader_num_workers=-1: must be at least 0 \(0 loads the batches in the training process\)\.$"),
    ("one-bucket", None, {"num_buckets": "1", "trajectory_ratio": "0.5"}, [],
     r"^num_buckets=1 with trajectory_ratio=0\.5: one bucket holds every token.* or trajectory_ratio=0 for plain MDLM\.$"),
    ("pad-to-negative-multiple", None, {"pad_to_multiple_of": "-8"}, [],
     r"^pad_to_multiple_of=-8: must be at least 1 \(or unset\)\.$"),
    ("decode-eval-compiled", None, {"decode_eval_decoding": "{{compile_blocks: true}}", "decode_eval_task": "gsm8k",
                                    **UNSCHEDULED}, [],
     r"^decode_eval_decoding compile_blocks: the evaluation decodes the model being trained"),
]


def _set(column: str, position: int, value: float) -> Callable[[dict], None]:
    def corrupt(row: dict) -> None:
        row[column][position] = value
    return corrupt


def _swap_starts(row: dict) -> None:
    starts = row["teacher_token_start"]
    starts[1], starts[2] = starts[2], starts[1]


BAD_SCORES: dict[str, Callable[[dict], None]] = {
    "lengths": lambda row: row["teacher_nll"].pop(),
    "negative": _set("teacher_nll", 2, -0.5),
    "nan": _set("teacher_nll", 2, float("nan")),
    "bucket": _set("teacher_bucket", 0, -1),
    "order": _swap_starts,
    "outside": lambda row: row["teacher_token_end"].__setitem__(-1, len(row["completion"]) + 5),
    "fraction": _set("teacher_token_start", 1, 0.5),
}


@pytest.fixture(scope="module")
def workspace(toy_inputs) -> Path:
    """The files a new user's mistakes point at: data in the wrong shape, a file for a folder, an earlier run."""
    folder = Path(toy_inputs["model_name_or_path"]).parent
    (folder / "gsm8k.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n")
    (folder / "plain.jsonl").write_text(json.dumps({"prompt": "1 + 1?", "completion": "2"}) + "\n")
    (folder / "number-prompt.jsonl").write_text(json.dumps({"prompt": 5, "completion": "2"}) + "\n")
    (folder / "rows.csv").write_text("prompt,completion\n")
    Dataset.from_dict({"prompt": [], "completion": []}).to_parquet(str(folder / "no-rows.parquet"))
    (folder / "a-file").write_text("")
    (folder / "empty.jsonl").write_text("")
    (folder / "empty").mkdir()
    (folder / "earlier-run" / "checkpoint-3").mkdir(parents=True)
    (folder / "earlier-run" / "notes.txt").write_text("")
    (folder / "other-files").mkdir()
    (folder / "other-files" / "notes.txt").write_text("")
    student, no_mask = Path(toy_inputs["model_name_or_path"]), folder / "student-no-mask"
    tokenizer = AutoTokenizer.from_pretrained(student)
    for name, corrupt in BAD_SCORES.items():  # scored data from elsewhere: row 0 fine, row 1 broken
        rows = synthetic_scored_rows(arithmetic_rows(2), tokenizer)
        corrupt(rows[1])
        Dataset.from_list(rows).to_parquet(str(folder / f"bad-{name}.parquet"))
    no_template = folder / "student-no-template"
    shutil.copytree(student, no_template, ignore=shutil.ignore_patterns("chat_template*"))
    bare = AutoTokenizer.from_pretrained(student)
    bare.chat_template = None
    bare.save_pretrained(no_template)
    larger = AutoTokenizer.from_pretrained(student)  # another model's: ids past the student's vocabulary
    larger.add_tokens([f"word{index}" for index in range(json.loads((student / "config.json").read_text())["vocab_size"])])
    larger.save_pretrained(folder / "tokenizer-larger")
    other_mask = AutoTokenizer.from_pretrained(student)  # another model's: the same size, another mask token
    other_mask.mask_token = other_mask.convert_ids_to_tokens(other_mask.mask_token_id - 1)
    other_mask.save_pretrained(folder / "tokenizer-other-mask")
    tokenizer.mask_token = None
    tokenizer.save_pretrained(no_mask)
    config = json.loads((student / "config.json").read_text())
    (no_mask / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "mask_token_id"}))
    return folder


@pytest.fixture
def offline_hub(monkeypatch):
    """No network and no token (Hub probes fail as an unreachable Hub does), and no model may load."""
    def unreachable(self, repo_id, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded before the inputs were checked")

    monkeypatch.setattr("huggingface_hub.HfApi.repo_info", unreachable)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("trims_hf.data.hub.get_token", lambda: None)
    monkeypatch.setattr("trims_hf.training.train_job.build_student", never)


@pytest.mark.parametrize("edit,changes,extra,expected", [case[1:] for case in MISTAKES], ids=[case[0] for case in MISTAKES])
def test_user_mistakes_are_one_line_before_any_model_loads(edit, changes, extra, expected, toy_inputs, workspace, tmp_path,
                                                           capsys, offline_hub):
    recipe = TOY
    if edit is not None:
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(edit(TOY.read_text()))
    output_dir = tmp_path / "run"
    inputs = {**toy_inputs, "output_dir": str(output_dir), **changes}
    argv = [arg.format(w=workspace) for key, value in inputs.items() if value is not None for arg in (f"--{key}", value)]
    assert main(["train", "--config", str(recipe), *argv, *(arg.format(w=workspace) for arg in extra)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, errors
    assert re.search(expected, errors[0].removeprefix("error: ")), errors[0]
    assert not output_dir.exists()  # nothing half-written


def test_a_recipes_own_settings_may_be_left_unread_by_an_override(toy):
    """Only what the command line gives is held to being read: the toy recipe's LoRA and trajectory settings stay
    when the command line turns LoRA or the trajectory samples off."""
    overrides = [*toy, "--use_lora", "false", "--trajectory_ratio", "0", "--bucket_ordering", "random"]
    model_args, _, args = parse_recipe(TOY, overrides)
    assert not model_args.use_lora and model_args.lora_r == 8 and args.p_future == 0.95
    check_overrides_read(model_args, args, override_keys(overrides))
    with pytest.raises(InputError, match=r"^lora_alpha=16: only a LoRA run reads it"):
        check_overrides_read(model_args, args, override_keys([*overrides, "--lora-alpha=16"]))


def test_lora_target_modules_the_student_lacks_are_one_line_naming_its_layers(tmp_path, toy, capsys):
    """A name matching nothing is refused even beside one that matches (peft would wrap q_proj and ignore foo). The
    names are the built model's, so this check runs once the (tiny) student is built: still one line, nothing written."""
    assert train_cli(toy, tmp_path / "run", "--lora_target_modules", "foo", "q_proj") == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert errors == ["error: lora_target_modules foo: no module of the student has that name; its linear layers "
                      "are down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj."]
    assert not (tmp_path / "run").exists()


def test_unwritable_output_parent(toy, tmp_path, capsys, offline_hub, monkeypatch):
    monkeypatch.setattr("trims_hf.errors.os.access", lambda path, mode: Path(path) != tmp_path)
    assert train_cli(toy, tmp_path / "run") == 2
    assert capsys.readouterr().err == f"error: output_dir {tmp_path / 'run'}: {tmp_path} is not writable.\n"


@pytest.mark.parametrize("argv,expected", [
    ([], "error: trims train needs --config RECIPE.yaml"),
    (["recipes/toy/trims_toy.yaml"], "error: trims train needs --config RECIPE.yaml"),
    (["--config", "recipes/toy/trims_toy.yml"], "error: --config recipes/toy/trims_toy.yml: no such file."),
    (["--config", str(RECIPES / "toy")], f"error: --config {RECIPES / 'toy'}: a folder, not a file."),
    (["--config", "recipes/toy/trims_toy.yaml", "--lora_r", "4", "--config=recipes/llada/trims_s1k.yaml"],
     "error: trims train takes one --config RECIPE.yaml"),
])
def test_command_line_without_a_recipe(argv, expected, capsys):
    assert main(["train", *argv]) == 2
    assert capsys.readouterr().err.startswith(expected)


@pytest.mark.parametrize("argv,config,overrides", [
    (["--num_buckets", "4", "--config", "a.yaml", "--lora_r", "8"], "a.yaml", ["--num_buckets", "4", "--lora_r", "8"]),
    (["--config=a.yaml", "--lora_r", "8"], "a.yaml", ["--lora_r", "8"]),
    (["--learning_rate", "-1e-4", "--bf16", "false", "--config", "a.yaml"], "a.yaml",
     ["--learning_rate", "-1e-4", "--bf16", "false"]),
])
def test_config_may_come_anywhere_and_overrides_keep_their_order(argv, config, overrides):
    (args,), rest = train_parser().parse_known(argv)
    assert (args.config, args.help_keys, rest) == (config, False, overrides)


PAPER = {"max_length": 1024, "num_train_epochs": 30, "learning_rate": 1e-4, "lr_scheduler_type": "cosine",
         "warmup_steps": 0.03, "weight_decay": 0.1, "lora_r": 32, "lora_alpha": 32, "bf16": True, "num_buckets": 8,
         "p_context": 0.05, "p_future": 0.95, "bucket_ordering": "hard_to_easy", "metric": "nll"}
GLOBAL_BATCH = {"llada": {"global_batch_size": 32, "compile_blocks": True},  # split by the batch search
                "dream": {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4}}  # x 8 GPUs
SEARCHED = ("llada/trims_s1k.yaml", "llada/mdlm_s1k.yaml", "llada_moe/trims_s1k.yaml")


@pytest.mark.parametrize("recipe", sorted(str(path.relative_to(RECIPES)) for path in RECIPES.glob("*/*.yaml")
                                          if path.parent.name != "accelerate"))
def test_recipes_that_search_the_split_give_none_and_compile_their_blocks(recipe):
    """A recipe with ``global_batch_size`` parses (no split given beside it) and compiles its blocks, which pays at the
    batches the search finds; the others keep their split by hand."""
    _, _, args = parse_recipe(RECIPES / recipe, ["--bf16", "false", "--use_cpu", "true"])
    searched = recipe in SEARCHED
    assert (args.global_batch_size == 32, args.compile_blocks) == (searched, searched)


@pytest.mark.parametrize("student", ["llada", "dream"])
def test_paper_recipes(student):
    trims, mdlm = read_recipe(RECIPES / student / "trims_s1k.yaml"), read_recipe(RECIPES / student / "mdlm_s1k.yaml")
    model_args, _, args = parse_recipe(RECIPES / student / "trims_s1k.yaml", ["--bf16", "false", "--use_cpu", "true"])
    assert model_args.model_kind == student
    values = {**trims, "learning_rate": args.learning_rate}
    assert {key: values[key] for key in PAPER} == PAPER
    assert {key: trims[key] for key in GLOBAL_BATCH[student]} == GLOBAL_BATCH[student]
    assert trims["trajectory_ratio"] == 0.1 and mdlm["trajectory_ratio"] == 0
    differ = {key for key in trims.keys() | mdlm.keys() if trims.get(key) != mdlm.get(key)}
    assert differ == {"trajectory_ratio", "output_dir"}


def readme_calls(name: str) -> list[ast.Call]:
    """Every call of ``name`` in the README's Python snippets."""
    snippets = re.findall(r"```python\n(.*?)```", (RECIPES.parent / "README.md").read_text(), re.DOTALL)
    return [node for snippet in snippets for node in ast.walk(ast.parse(snippet))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == name]


def test_readme_python_quick_start_trains_what_the_recipe_trains(tmp_path):
    """The README's MDLMTrainer snippet sets up the objective of recipes/llada/trims_s1k.yaml (masking, padding, format),
    and its plain-Trainer snippet pads as the recipes do and advances the collator's epoch."""
    [config] = readme_calls("MDLMConfig")
    values = {keyword.arg: ast.literal_eval(keyword.value) for keyword in config.keywords}
    readme = MDLMConfig(**(values | {"output_dir": str(tmp_path), "bf16": False, "use_cpu": True}))
    _, _, recipe = parse_recipe(RECIPES / "llada" / "trims_s1k.yaml", ["--bf16", "false", "--use_cpu", "true"])
    assert readme.masking() == recipe.masking() and readme.student_format() == recipe.student_format()
    assert (readme.global_batch_size, readme.compile_blocks) == (recipe.global_batch_size, recipe.compile_blocks)
    [masking] = readme_calls("MaskingConfig")
    assert {k.arg: ast.literal_eval(k.value) for k in masking.keywords} == {"padding": recipe.padding}
    [trainer] = readme_calls("Trainer")
    callbacks = next(k.value for k in trainer.keywords if k.arg == "callbacks")
    assert [c.func.id for c in callbacks.elts] == ["CollatorEpochCallback"]


def adapter_and_losses(folder: Path) -> tuple[dict[str, torch.Tensor], list[float]]:
    state = json.loads((folder / "trainer_state.json").read_text())
    return load_file(folder / "adapter_model.safetensors"), [e["loss"] for e in state["log_history"] if "loss" in e]


def interrupt_at_step(monkeypatch, step: int, signal_number: int | None) -> None:
    """Ctrl-C during training step ``step``: the SIGINT a terminal sends, or (None) a KeyboardInterrupt raised there."""
    original, calls = MDLMTrainer.training_step, []

    def training_step(self, *args, **kwargs):
        calls.append(None)
        if len(calls) == step:
            if signal_number is None:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal_number)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MDLMTrainer, "training_step", training_step)


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_the_resumed_run_equals_a_straight_one(tmp_path, toy, capsys, monkeypatch):
    """Ctrl-C in step 3: the step ends, checkpoint-3 is saved, exit 130 with how to continue; continuing as told gives
    the weights and losses of an uninterrupted run."""
    common = ("--per_device_train_batch_size", "16", "--lr_scheduler_type", "constant", "--warmup_steps", "0",
              "--trajectory_ratio", "0.5", "--max_steps", "6", "--save_strategy", "no")
    assert train_cli(toy, tmp_path / "straight", *common) == 0
    interrupt_at_step(monkeypatch, 3, signal.SIGINT)
    capsys.readouterr()
    assert train_cli(toy, tmp_path / "split", *common) == 130
    checkpoint = tmp_path / "split" / "checkpoint-3"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted at step 3 of 6; {checkpoint} holds step 3: continue from it with the same command and "
        "--resume_from_checkpoint true.")
    assert not (tmp_path / "split" / "adapter_model.safetensors").exists()  # no final adapter from a partial run
    monkeypatch.undo()
    assert train_cli(toy, tmp_path / "split", *common, "--resume_from_checkpoint", "true") == 0
    straight, straight_losses = adapter_and_losses(tmp_path / "straight")
    resumed, resumed_losses = adapter_and_losses(tmp_path / "split")
    assert len(straight_losses) == 6 and resumed_losses == straight_losses
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


def test_second_ctrl_c_stops_at_once_and_says_what_is_kept(tmp_path, toy, capsys, monkeypatch):
    interrupt_at_step(monkeypatch, 2, None)
    assert train_cli(toy, tmp_path / "run", "--max_steps", "6", "--save_strategy", "no") == 130
    assert capsys.readouterr().err.splitlines()[-1].startswith("interrupted at step 1 of 6; no checkpoint was saved")


@pytest.mark.slow
def test_resume_reproduces_a_straight_run(tmp_path, toy):
    """6 steps straight == 3 steps, then resume from checkpoint-3 for 3 more (crossing an epoch boundary)."""
    common = ("--per_device_train_batch_size", "16", "--lr_scheduler_type", "constant", "--warmup_steps", "0",
              "--lora_dropout", "0.1", "--trajectory_ratio", "0.5")  # dropout and trajectory draws exercise RNG state
    assert train_cli(toy, tmp_path / "straight", *common, "--max_steps", "6", "--save_strategy", "no") == 0
    assert train_cli(toy, tmp_path / "split", *common, "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "3") == 0
    assert train_cli(toy, tmp_path / "split", *common, "--max_steps", "6", "--save_strategy", "no",
                     "--resume_from_checkpoint", str(tmp_path / "split" / "checkpoint-3")) == 0
    straight, straight_losses = adapter_and_losses(tmp_path / "straight")
    resumed, resumed_losses = adapter_and_losses(tmp_path / "split")
    assert len(straight_losses) == 6 and resumed_losses == straight_losses
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name



@pytest.mark.slow
def test_a_resumed_run_must_be_the_checkpoints_run_with_steps_left(tmp_path, toy, capsys):
    """Resuming under other defining settings, or with no steps left, is one line before anything loads and leaves
    the run's folder as it was; the split of the global batch and the length may change; a checkpoint that records
    no settings resumes with a warning."""
    common = ("--per_device_train_batch_size", "16", "--lr_scheduler_type", "constant", "--warmup_steps", "0")
    run = tmp_path / "run"
    assert train_cli(toy, run, *common, "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "2") == 0
    checkpoint = run / "checkpoint-2"
    recorded = json.loads((checkpoint / RUN_FILE).read_text())["settings"]
    assert (checkpoint / BASE_FINGERPRINT).is_file()  # each checkpoint is an adapter folder of its own
    assert recorded["num_buckets"] == 8 and recorded["learning_rate"] == 3e-3 and recorded["lora_r"] == 8
    assert Path(recorded["dataset_name"]).is_absolute()  # a resume from another working folder names the same data
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    resume = ("--resume_from_checkpoint", "true")
    capsys.readouterr()
    assert train_cli(toy, run, *common, *resume, "--max_steps", "4", "--num_buckets", "4", "--learning_rate", "1",
                     "--lora_r", "4") == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: resume_from_checkpoint {checkpoint}: its run was trained with other settings: learning_rate (0.003 -> "
        "1.0), lora_r (8 -> 4), num_buckets (8 -> 4); resume with the run's settings, or start a new run in another "
        "output_dir."]
    assert train_cli(toy, run, *common, *resume, "--max_steps", "2") == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: resume_from_checkpoint {checkpoint}: it holds step 2, and max_steps is 2, so nothing is left to train; "
        "raise max_steps to train on."]
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before
    split = ("--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2", *common[2:])
    assert train_cli(toy, run, *split, *resume, "--max_steps", "3", "--save_strategy", "no") == 0
    (checkpoint / RUN_FILE).unlink()
    assert train_cli(toy, tmp_path / "plain", *common, "--max_steps", "3", "--save_strategy", "no",
                     "--resume_from_checkpoint", str(checkpoint)) == 0
    assert f"warning: {checkpoint} records no settings ({RUN_FILE})" in capsys.readouterr().err
    (checkpoint / "trainer_state.json").write_text("{")
    assert train_cli(toy, tmp_path / "plain", *common, "--max_steps", "3", "--resume_from_checkpoint", str(checkpoint)) == 2
    assert capsys.readouterr().err.startswith(f"error: resume_from_checkpoint {checkpoint}: trainer_state.json is not "
                                              "JSON (")


@pytest.mark.slow
def test_a_run_of_epochs_is_extended_by_more_epochs_and_refused_without(tmp_path, toy, capsys):
    """transformers' way to extend a finished run of epochs: the same command with more of them."""
    common = ("--per_device_train_batch_size", "32", "--lr_scheduler_type", "constant", "--warmup_steps", "0",
              "--save_strategy", "epoch")
    run = tmp_path / "run"
    assert train_cli(toy, run, *common, "--num_train_epochs", "1") == 0
    capsys.readouterr()
    assert train_cli(toy, run, *common, "--num_train_epochs", "1", "--resume_from_checkpoint", "true") == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: resume_from_checkpoint {run / 'checkpoint-2'}: its run finished its 1 epochs (step 2), so nothing is "
        "left to train; raise num_train_epochs to train on."]
    assert train_cli(toy, run, *common, "--num_train_epochs", "2", "--resume_from_checkpoint", "true") == 0
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 4


def test_ctrl_c_in_the_last_step_finishes_the_run(tmp_path, toy, capsys, monkeypatch):
    """The checkpoint Ctrl-C saves at the last step holds the whole run: it ends as an uninterrupted one (adapter,
    state, card), not with advice to resume a run that has nothing left."""
    interrupt_at_step(monkeypatch, 3, signal.SIGINT)
    assert train_cli(toy, tmp_path / "run", "--max_steps", "3", "--save_strategy", "no") == 0
    assert (tmp_path / "run" / "adapter_model.safetensors").is_file() and (tmp_path / "run" / "README.md").is_file()


def test_trims_train_lets_cuda_segments_grow_unless_the_allocator_is_set_up(tmp_path, monkeypatch):
    """Before anything starts CUDA, ``trims train`` sets ``expandable_segments:True`` (the batch search frees its
    probes' blocks); an allocator set up by the user, under either of torch's names, is left alone."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("lerning_rate: 0.1\n")  # refused after the allocator is set up, before anything loads
    for given, expected in (({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
                            ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:512"}, {"PYTORCH_ALLOC_CONF": "max_split_size_mb:512"}),
                            ({"PYTORCH_CUDA_ALLOC_CONF": "backend:native"}, {"PYTORCH_CUDA_ALLOC_CONF": "backend:native"})):
        environ = {key: value for key, value in os.environ.items() if key not in ALLOCATOR_SETTINGS} | given
        monkeypatch.setattr(os, "environ", environ)
        assert main(["train", "--config", str(recipe)]) == 2
        assert {key: environ[key] for key in ALLOCATOR_SETTINGS if key in environ} == expected


def test_a_reporting_integration_not_installed_is_one_line_before_any_model_loads(toy_inputs, tmp_path, capsys,
                                                                                 offline_hub, monkeypatch):
    """transformers raises for a missing ``report_to`` package only when it builds the callback, after the model."""
    monkeypatch.setattr("transformers.integrations.integration_utils.is_wandb_available", lambda: False)
    argv = [arg for key, value in {**toy_inputs, "output_dir": str(tmp_path / "run")}.items()
            for arg in (f"--{key}", value)]
    assert main(["train", "--config", str(TOY), *argv, "--report_to", "wandb"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("error: report_to wandb: its package is not installed here; "
                                                        "install it, or set report_to none.")
    assert main(["train", "--config", str(TOY), *argv, "--report_to", "tensorbord"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "error: report_to tensorbord: tensorbord is not supported, only azure_ml, ")
    assert not (tmp_path / "run").exists()
    from trims_hf.training.train_job import check_reporting

    check_reporting(MDLMConfig(output_dir=str(tmp_path), report_to=None, use_cpu=True).report_to)  # null: nothing
