"""`trims score` as a user meets it: every mistake is one `error:` line in the user's terms (exit 2) before any
model loads, with nothing written; Ctrl-C says what was kept (exit 130) and the rerun resumes to the same result."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, load_dataset
from helpers_teachers import save_teacher
from huggingface_hub import HfApi

from trims_hf.cli import main as trims_main
from trims_hf.data import score_job as job
from trims_hf.data.hub import read_card_metadata
from trims_hf.data.schema import SchemaError, as_prompt_completion
from trims_hf.data.score_job import work_dir_for
from trims_hf.data.teacher import load_teacher

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def teacher_dir(tokenizer, tmp_path_factory) -> Path:
    return save_teacher(tokenizer, tmp_path_factory.mktemp("teacher") / "tiny-teacher")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_as_prompt_completion_renames_the_two_columns_and_keeps_the_rest():
    rows = Dataset.from_list([{"question": "q1", "answer": "a1", "prompt": "stale", "id": 7}])
    renamed = as_prompt_completion(rows, "question", "answer")
    assert list(renamed) == [{"prompt": "q1", "completion": "a1", "id": 7}]  # a column already named prompt is replaced
    assert list(as_prompt_completion(renamed, "prompt", "completion")) == list(renamed)  # schema rows pass through
    with pytest.raises(SchemaError, match=r"^--completion-column solution: no such column \(columns: question, answer"):
        as_prompt_completion(rows, "question", "solution", names=("--prompt-column", "--completion-column"))
    schema = Dataset.from_list([{"prompt": "P", "completion": "C", "question": "Q"}])
    assert list(as_prompt_completion(schema, "completion", "prompt")) == [{"prompt": "C", "completion": "P", "question": "Q"}]
    assert list(as_prompt_completion(schema, "question", "prompt")) == [{"prompt": "Q", "completion": "P"}]
    with pytest.raises(SchemaError, match=r"^--prompt-column and --completion-column both name the column question; "):
        as_prompt_completion(schema, "question", "question", names=("--prompt-column", "--completion-column"))
    chat = Dataset.from_list([{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}])
    with pytest.raises(SchemaError, match=r"^--prompt-column prompt: no such column \(columns: messages\); the rows are "
                                          r"chat 'messages': give the prompt \(the turns before the answer\) and the "):
        as_prompt_completion(chat, "prompt", "completion", names=("--prompt-column", "--completion-column"))


@pytest.fixture(scope="module")
def data_file(gsm8k_rows, tmp_path_factory) -> Path:
    rows = [{"question": r["prompt"], "answer": r["completion"]} for r in gsm8k_rows[:8]]
    return write_jsonl(tmp_path_factory.mktemp("data") / "gsm8k.jsonl", rows)


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the teacher's weights were loaded before the mistake was reported")

    monkeypatch.setattr(job, "load_teacher", refuse)


@pytest.fixture
def unreachable_hub(monkeypatch):
    def refuse(self, repo_id, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(HfApi, "repo_info", refuse)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error")]


# case -> (extra flags, files to make, expected error line); {tmp}, {data}, {teacher}, {out} are filled in.
CASES = {
    "missing data file": (["--dataset", "{tmp}/nope.jsonl"], {}, "--dataset {tmp}/nope.jsonl: no such file or folder."),
    "csv data file": (["--dataset", "{tmp}/rows.csv"], {"rows.csv": "a,b\n"},
                      "--dataset {tmp}/rows.csv: unsupported file type '.csv' (use .jsonl, .json, .parquet)."),
    "broken jsonl": (["--dataset", "{tmp}/bad.jsonl"], {"bad.jsonl": '{"question": "q", "answer": "a"\n{broken\n'},
                     "--dataset {tmp}/bad.jsonl: line 1 is not valid JSON (Expecting ',' delimiter, column 32)."),
    "jsonl of arrays": (["--dataset", "{tmp}/arrays.jsonl"], {"arrays.jsonl": '\n[1, 2]\n[3, 4]\n'},
                        '--dataset {tmp}/arrays.jsonl: row 0 is an array, not an object of columns (e.g. {{"prompt": '
                        '..., "completion": ...}}).'),
    "jsonl of strings": (["--dataset", "{tmp}/strings.jsonl"], {"strings.jsonl": '"q"\n'},
                         '--dataset {tmp}/strings.jsonl: row 0 is a string, not an object of columns (e.g. {{"prompt": '
                         '..., "completion": ...}}).'),
    "split of a file": (["--split", "test"], {},
                        "--dataset {data} is a single file, whose one split is 'train'; got --split 'test'."),
    "missing teacher": (["--teacher", "{tmp}/no-teacher"], {}, "--teacher {tmp}/no-teacher: no such file or folder."),
    "teacher folder without config": (["--teacher", "{tmp}/empty"], {"empty/": ""},
                                      "--teacher {tmp}/empty: the folder has no config.json."),
    "missing gguf file": (["--gguf-file", "x.gguf"], {}, "--gguf-file x.gguf: no such file in {teacher}."),
    "output exists": ([], {"out/": ""}, "--output {out}: already exists; choose another folder or pass --overwrite."),
    "output under a file": (["--output", "{tmp}/file/out"], {"file": "x"},
                            "--output {tmp}/file/out: {tmp}/file is a file, not a folder."),
    "missing column": (["--prompt-column", "prompt"], {},
                       "--prompt-column prompt: no such column (columns: question, answer)."),
    "empty completion": (["--dataset", "{tmp}/empty.jsonl"], {"empty.jsonl": '{"question": "q", "answer": "  "}\n'},
                         "row 0: column 'answer' (--completion-column) is empty."),
    "no rows": (["--dataset", "{tmp}/none.jsonl"], {"none.jsonl": ""}, "--dataset {tmp}/none.jsonl: no rows."),
    "no rows in a parquet file": (["--dataset", "{tmp}/none.parquet"], {"none.parquet": None},
                                  "--dataset {tmp}/none.parquet: no rows."),
    "blank lines only": (["--dataset", "{tmp}/blank.jsonl"], {"blank.jsonl": "\n\n"}, "--dataset {tmp}/blank.jsonl: no rows."),
    "corrupt parquet": (["--dataset", "{tmp}/g.parquet"], {"g.parquet": "x\n"},
                        "--dataset {tmp}/g.parquet: cannot be read as a .parquet file (Parquet file size is 2 bytes, "
                        "smaller than the minimum file footer (8 bytes))."),
    "corrupt file in a folder": (["--dataset", "{tmp}/bad"], {"bad/": "", "bad/x.parquet": "x\n"},
                                 "--dataset {tmp}/bad: cannot be read as a data set folder (ArrowInvalid: Parquet file "
                                 "size is 2 bytes, smaller than the minimum file footer (8 bytes))."),
    "empty folder": (["--dataset", "{tmp}/empty"], {"empty/": ""},
                     "--dataset {tmp}/empty: no data files in the folder (.parquet, .jsonl, .json, .csv, ...)."),
    "folder of two formats": (["--dataset", "{tmp}/mixed"],
                              {"mixed/": "", "mixed/a.jsonl": '{"question": "q", "answer": "a"}\n',
                               "mixed/more/": "", "mixed/more/b.csv": "question,answer\nq,a\n"},
                              "--dataset {tmp}/mixed: the folder holds data files of several formats (1 .csv, 1 .jsonl), "
                              "and datasets reads only one of them, dropping the others' rows; keep one format in it, or "
                              "pass a file."),
    "no row groups in a parquet file": (["--dataset", "{tmp}/bare.parquet"], {"bare.parquet": "no row groups"},
                                        "--dataset {tmp}/bare.parquet: no rows."),
    "bad json past pyarrow's first block": (["--dataset", "{tmp}/long.jsonl"], {"long.jsonl": "bad line 40001"},
                                            "--dataset {tmp}/long.jsonl: line 40001 is not valid JSON (Expecting value, "
                                            "column 29)."),
    "not utf-8": (["--dataset", "{tmp}/latin.jsonl"],
                  {"latin.jsonl": b'{"question": "q", "answer": "a"}\n{"question": "caf\xe9", "answer": "a"}\n'},
                  "--dataset {tmp}/latin.jsonl: line 2 is not UTF-8 text (byte 17: b'\\xe9'); JSON Lines are UTF-8."),
    "null completion": (["--dataset", "{tmp}/null.jsonl"], {"null.jsonl": '{"question": "q", "answer": null}\n'},
                        "row 0: column 'answer' (--completion-column) is missing or null."),
    "too long": (["--teacher-max-length", "150"], {},
                 "row 0: column 'answer' (--completion-column) is too long for the teacher: 108 prompt + 90 completion "
                 "tokens > context 150 (pass a larger --teacher-max-length, or --truncate)."),
    "prompt alone too long": (["--teacher-max-length", "30", "--truncate"], {},
                              "row 0: column 'question' (--prompt-column) alone is 108 teacher tokens, leaving none of "
                              "the context 30 to the completion; pass a larger --teacher-max-length, or drop the row."),
    "prompt without tokens": (["--dataset", "{tmp}/p.jsonl", "--prompt-format", "verbatim"],
                              {"p.jsonl": '{"question": "", "answer": "Natalia sold 48 clips."}\n'},
                              "row 0: column 'question' (--prompt-column) renders to no teacher tokens, so nothing predicts "
                              "the first completion token; give a prompt, or a --prompt-format that adds one "
                              "(chat_template, plain with a BOS)."),
    "no kept tokens": (["--train-max-length", "20"], {},
                       "no row has a completion token within --train-max-length 20 teacher tokens (the prompts are "
                       "longer); raise it, or cut quantiles over --quantile-tokens all."),
    "num buckets": (["--num-buckets", "0"], {}, "--num-buckets must be in [1, 127], got 0. (see `trims score --help`)"),
    "prompt format": (["--prompt-format", "foo"], {},
                      "--prompt-format must be one of chat_template, plain, verbatim or contain '{{prompt}}', got 'foo'. "
                      "(see `trims score --help`)"),
    "limit": (["--limit", "0"], {}, "--limit 0: must be at least 1. (see `trims score --help`)"),
    "chunk size": (["--rows-per-work-chunk", "0"], {}, "--rows-per-work-chunk 0: must be at least 1. (see `trims score --help`)"),
    "push offline": (["--push-to-hub", "me/x"], {},
                     "Cannot push to me/x: HF_HUB_OFFLINE is set. Unset it, or drop --push-to-hub."),
    "scored already": (["--dataset", "{tmp}/s.jsonl"],
                       {"s.jsonl": '{"question": "q", "answer": "a", "teacher_token_start": [0], "teacher_token_end": [1], '
                                   '"teacher_nll": [1.0], "teacher_entropy": [1.0], "teacher_bucket": [0]}\n'},
                       "the data set already has the scored column(s) teacher_token_start, teacher_token_end, teacher_nll, "
                       "teacher_entropy, teacher_bucket: it was scored already; pass the unscored rows (or drop those "
                       "columns to score it again)."),
    "bucket column only": (["--dataset", "{tmp}/b.jsonl"],
                           {"b.jsonl": '{"question": "q", "answer": "a", "teacher_bucket": [0]}\n'},
                           "the data set already has the scored column(s) teacher_bucket: it was scored already; pass the "
                           "unscored rows (or drop those columns to score it again)."),
    "number as prompt": (["--dataset", "{tmp}/p.jsonl"], {"p.jsonl": '{"question": 5, "answer": "a"}\n'},
                         "row 0: column 'question' (--prompt-column) is 5; a prompt is a text or a list of chat messages "
                         "{{role, content}}."),
    "mapping as prompt": (["--dataset", "{tmp}/p.jsonl"], {"p.jsonl": '{"question": {"a": 1}, "answer": "a"}\n'},
                          "row 0: column 'question' (--prompt-column) is {{'a': 1}}; a prompt is a text or a list of chat "
                          "messages {{role, content}}."),
    "texts as prompt": (["--dataset", "{tmp}/p.jsonl"], {"p.jsonl": '{"question": ["a", "b"], "answer": "a"}\n'},
                        "row 0: column 'question' (--prompt-column) has 'a' as message 0; a chat message is "
                        "{{role, content}}, both text."),
    "message without content": (["--dataset", "{tmp}/p.jsonl"],
                                {"p.jsonl": '{"question": [{"role": "user", "content": "q"}], "answer": "a"}\n'
                                            '{"question": [{"role": "user"}], "answer": "a"}\n'},
                                "row 1: column 'question' (--prompt-column) has {{'role': 'user'}} as message 0; a chat "
                                "message is {{role, content}}, both text."),
    "system prompt with the plain format": (["--prompt-format", "plain", "--system-prompt", "be nice"], {},
                                            "--system-prompt goes into the chat template, and --prompt-format 'plain' "
                                            "renders none; drop --system-prompt, or use --prompt-format "
                                            "'chat_template'. (see `trims score --help`)"),
    "hub flags without a push": (["--token", "abc", "--private"], {},
                                 "--token, --private: only --push-to-hub reads them; drop them, or pass --push-to-hub "
                                 "REPO."),
    "bucket seed of no random ordering": (["--bucket-seed", "3"], {},
                                          "--bucket-seed 3 seeds the random ordering only, and --bucket-ordering is "
                                          "hard_to_easy; drop --bucket-seed, or set --bucket-ordering random."),
    "output is the dataset": (["--dataset", "{tmp}/d", "--output", "{tmp}/d", "--overwrite"], {"d/": ""},
                              "--output {tmp}/d is --dataset {tmp}/d, the data it is made from; write it to a folder "
                              "apart."),
    "output holds the dataset": (["--dataset", "{tmp}/d/rows.jsonl", "--output", "{tmp}/d", "--overwrite"],
                                 {"d/": "", "d/rows.jsonl": '{"question": "q", "answer": "a"}\n'},
                                 "--output {tmp}/d holds --dataset {tmp}/d/rows.jsonl, the data it is made from; write "
                                 "it to a folder apart."),
    "output inside the dataset": (["--dataset", "{tmp}/d", "--output", "{tmp}/d/scored"], {"d/": ""},
                                  "--output {tmp}/d/scored lies inside --dataset {tmp}/d, the data it is made from; "
                                  "write it to a folder apart."),
    "one column for both": (["--completion-column", "question"], {},
                            "--prompt-column and --completion-column both name 'question': the prompt and the "
                            "completion are two columns. (see `trims score --help`)"),
    "output is the teacher": (["--output", "{teacher}", "--overwrite"], {},
                              "--output {teacher} is --teacher {teacher}, the model it is made from; write it to a "
                              "folder apart."),
    "output holds the teacher": (["--output", "{teachers}", "--overwrite"], {},
                                 "--output {teachers} holds --teacher {teacher}, the model it is made from; write it to "
                                 "a folder apart."),
    "output is the current folder": (["--output", ".", "--overwrite"], {},
                                     "--output .: holds the current folder, and the scored data replaces its folder "
                                     "whole; name a new folder."),
    "output holds the current folder": (["--output", "..", "--overwrite"], {},
                                        "--output ..: holds the current folder, and the scored data replaces its "
                                        "folder whole; name a new folder."),
}


def test_a_jsonl_file_of_one_array_of_rows_is_read_as_its_rows(tmp_path):
    """datasets reads a .jsonl holding one JSON array of objects as those rows: only files of other values are
    refused (their rows would become one ``text`` column)."""
    from trims_hf.data.hub import load_source_dataset

    rows = [{"question": "q1", "answer": "a1"}, {"question": "q2", "answer": "a2"}]
    (tmp_path / "array.jsonl").write_text("\n" + json.dumps(rows) + "\n")
    assert load_source_dataset(str(tmp_path / "array.jsonl"), flag="--dataset").to_list() == rows


def test_a_folder_saved_with_save_to_disk_is_read_as_its_splits(tmp_path):
    """``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` folders, which ``load_dataset`` refuses, load as the
    data set (its one split, ``train``) or the split asked for."""
    from datasets import DatasetDict

    from trims_hf.data.hub import load_source_dataset
    from trims_hf.sources import SourceError

    rows = [{"question": "q1", "answer": "a1"}, {"question": "q2", "answer": "a2"}]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    DatasetDict({"train": Dataset.from_list(rows[:1]), "test": Dataset.from_list(rows[1:])}).save_to_disk(
        str(tmp_path / "two"))
    assert load_source_dataset(str(tmp_path / "one"), flag="--dataset").to_list() == rows
    assert load_source_dataset(str(tmp_path / "two"), "test", flag="--dataset").to_list() == rows[1:]
    with pytest.raises(SourceError, match=r"one holds one data set, read as the split 'train'; got split='test'\.$"):
        load_source_dataset(str(tmp_path / "one"), "test", flag="--dataset")
    with pytest.raises(SourceError, match=r"two has no split='dev' \(its splits: train, test\)\.$"):
        load_source_dataset(str(tmp_path / "two"), "dev", flag="--dataset")


def test_the_old_max_length_flag_still_sets_the_teachers_context_with_a_notice(teacher_dir, data_file, tmp_path, capsys,
                                                                              no_model_load):
    """``--max-length`` of ``trims score`` was the teacher's context, while ``trims train``'s is the student's
    sequence: renamed ``--teacher-max-length``, the old spelling still works and says so in one line."""
    base = ["score", "--teacher", str(teacher_dir), "--dataset", str(data_file), "--prompt-column", "question",
            "--completion-column", "answer", "--output", str(tmp_path / "out")]
    assert trims_main([*base, "--max-length", "150"]) == 2  # the row is too long for a context of 150: it was set
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("note")] == [
        "note: --max-length is now --teacher-max-length (its value is used as given)."]
    (error,) = error_lines(err)
    assert error.endswith("tokens > context 150 (pass a larger --teacher-max-length, or --truncate).")


@pytest.mark.parametrize("case", list(CASES))
def test_each_mistake_is_one_line_before_any_model_loads(case, teacher_dir, data_file, tmp_path, capsys, monkeypatch,
                                                         no_model_load):
    flags, files, expected = CASES[case]
    for name, content in files.items():
        if content is None:  # a parquet file with the columns and no rows
            Dataset.from_dict({"question": [], "answer": []}).to_parquet(str(tmp_path / name))
        elif isinstance(content, str) and content == "no row groups":  # as pyarrow writes an empty table
            pq.write_table(pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}),
                           tmp_path / name)
        elif isinstance(content, str) and content.startswith("bad line "):  # 300-byte rows: pyarrow reads blocks
            good = json.dumps({"question": "q" * 130, "answer": "a" * 130}) + "\n"
            (tmp_path / name).write_text(good * (int(content.split()[-1]) - 1) + '{"question": "q", "answer": }\n' + good)
        else:
            path = tmp_path / name
            path.mkdir() if name.endswith("/") else path.write_bytes(content) if isinstance(content, bytes) \
                else path.write_text(content)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", case == "push offline")
    out = tmp_path / "out"
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")  # "." and ".." name folders of this test's own
    names = {"tmp": tmp_path, "data": data_file, "teacher": teacher_dir, "teachers": teacher_dir.parent, "out": out}
    base = ["--teacher", str(teacher_dir), "--dataset", str(data_file), "--prompt-column", "question",
            "--completion-column", "answer", "--output", str(out)]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert trims_main(["score", *base, *(flag.format(**names) for flag in flags)]) == 2
    err = capsys.readouterr().err
    assert error_lines(err) == ["error: " + expected.format(**names)]
    assert "running on" not in err  # a plain one-process run says nothing of its processes
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no work folder


@pytest.mark.parametrize("flag, value, default", [("--teacher", None, "Qwen/Qwen3-8B (the default)"),
                                                  ("--dataset", "org/data", "org/data")])
def test_unreachable_hub_says_what_works_offline(flag, value, default, teacher_dir, data_file, tmp_path, capsys,
                                                 unreachable_hub, no_model_load):
    args = {"--teacher": str(teacher_dir), "--dataset": str(data_file)}
    if value is None:
        del args[flag]
    else:
        args[flag] = value
    start = time.monotonic()
    code = trims_main(["score", *(x for pair in args.items() for x in pair), "--output", str(tmp_path / "out")])
    hint = "pass a local model folder or .gguf file to --teacher" if flag == "--teacher" else \
        "pass a local .jsonl/.json/.parquet file or dataset folder to --dataset"
    assert code == 2 and time.monotonic() - start < 5
    assert error_lines(capsys.readouterr().err) == [
        f"error: {flag} {default}: not a local path, and the Hugging Face Hub is unreachable ([Errno -2] Name or service "
        f"not known); {hint}."]


@pytest.mark.parametrize("typed", [["--teacher", "Qwen/Qwen3-8B"], ["--teacher=Qwen/Qwen3-8B"]])
def test_a_default_typed_is_not_called_the_default(typed, data_file, tmp_path, capsys, monkeypatch, no_model_load):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert trims_main(["score", *typed, "--dataset", str(data_file), "--output", str(tmp_path / "out")]) == 2
    assert error_lines(capsys.readouterr().err) == [
        "error: --teacher Qwen/Qwen3-8B: not a local path and not in the Hugging Face cache, and HF_HUB_OFFLINE is set; "
        "pass a local model folder or .gguf file to --teacher."]


def score_args(teacher_dir: Path, data_file: Path, out: Path) -> list[str]:
    return ["score", "--teacher", str(teacher_dir), "--dataset", str(data_file), "--prompt-column", "question",
            "--completion-column", "answer", "--output", str(out)]


def test_interrupt_says_what_was_kept_and_the_rerun_resumes(teacher_dir, data_file, tmp_path, capsys, monkeypatch):
    reference = tmp_path / "reference"
    assert trims_main(score_args(teacher_dir, data_file, reference)) == 0  # 8 rows: 8 chunks of one row
    capsys.readouterr()
    calls, score_rows = [], job.score_rows

    def interrupted_on_third_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return score_rows(*args, **kwargs)

    monkeypatch.setattr(job, "score_rows", interrupted_on_third_chunk)
    out = tmp_path / "scored"
    assert trims_main(score_args(teacher_dir, data_file, out)) == 130
    (work,) = work_dir_for(out).iterdir()
    err = capsys.readouterr().err.splitlines()
    assert f"interrupted: 2 of 8 chunks saved in {work}; rerun the same command to resume." in err
    assert not out.exists() and len(list(work.glob("chunk-*.parquet"))) == 2 and not list(work.glob(".*"))

    monkeypatch.setattr(job, "score_rows", score_rows)
    assert trims_main(score_args(teacher_dir, data_file, out)) == 0
    assert f"resuming: 2 of 8 chunks done (saved in {work})" in capsys.readouterr().err.splitlines()
    assert not work_dir_for(out).exists()
    resumed, whole = load_dataset(str(out), split="train"), load_dataset(str(reference), split="train")
    assert resumed["teacher_token_start"] == whole["teacher_token_start"]
    assert resumed["teacher_bucket"] == whole["teacher_bucket"]
    np.testing.assert_array_equal(np.concatenate(resumed["teacher_nll"]), np.concatenate(whole["teacher_nll"]))


def test_a_crash_while_saving_a_chunk_leaves_the_saved_chunks_and_no_partial_file(teacher_dir, data_file, tmp_path,
                                                                                   monkeypatch):
    """An error between a chunk's write and its rename (a full disk, a lost mount) keeps the chunks saved before it
    and no temporary file in the work folder."""
    renames = []

    def replace_failing_on_the_third(source, target):
        renames.append(target)
        if len(renames) == 3:
            raise OSError(28, "No space left on device")
        os.replace(source, target)

    monkeypatch.setattr(job, "os", SimpleNamespace(replace=replace_failing_on_the_third, getpid=os.getpid,
                                                   PathLike=os.PathLike))
    out = tmp_path / "scored"
    with pytest.raises(OSError, match="No space left"):
        trims_main(score_args(teacher_dir, data_file, out))
    (work,) = work_dir_for(out).iterdir()
    assert len(list(work.glob("chunk-*.parquet"))) == 2 and not list(work.glob(".*"))


def terminal_sigint() -> None:
    """SIGINT as a terminal's command gets it: a suite started in the background by a shell without job control
    ignores SIGINT, and a child inherits that, so without this the signal below would be lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_on_the_command(teacher_dir, gsm8k_rows, tmp_path):
    """A real SIGINT to `python -m trims_hf.cli score` once the first chunk is saved: exit 130 and the kept count.
    The rows are repeated 20 times so that the 16 chunks take seconds to score: the signal must arrive while most are
    still to come, on a fast machine too."""
    rows = [{"question": r["prompt"], "answer": r["completion"]} for r in gsm8k_rows] * 20
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "scored"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "trims_hf.cli", *score_args(teacher_dir, data, out),
                                "--max-tokens-per-batch", "1"], stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=terminal_sigint)
    deadline = time.monotonic() + 120
    while not list(work_dir_for(out).glob("*/chunk-*.parquet")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err[-2000:]
    match = re.search(r"^interrupted: (\d+) of 16 chunks saved in (\S+); rerun the same command to resume\.$", err, re.M)
    assert match and 1 <= int(match[1]) < 16 and Path(match[2]).parent == work_dir_for(out)
    assert "Traceback" not in err and not out.exists()


def test_an_output_scored_already_is_refused_as_input_before_the_teacher_loads(teacher_dir, data_file, tmp_path, capsys,
                                                                              monkeypatch):
    """Rescoring a `trims score` output would clash its old scored columns with the new ones at the merge, after the
    whole run: the rows are refused first, and nothing (no work folder) is left to trip a rerun."""
    scored = tmp_path / "scored"
    assert trims_main(score_args(teacher_dir, data_file, scored)) == 0
    monkeypatch.setattr(job, "load_teacher", lambda *args, **kwargs: pytest.fail("the teacher loaded"))
    monkeypatch.setattr(job, "load_teacher_tokenizer", lambda *args, **kwargs: pytest.fail("the tokenizer loaded"))
    capsys.readouterr()
    again = tmp_path / "again"
    assert trims_main(["score", "--teacher", str(teacher_dir), "--dataset", str(scored), "--output", str(again)]) == 2
    assert error_lines(capsys.readouterr().err) == [
        "error: the data set already has the scored column(s) teacher_token_start, teacher_token_end, teacher_nll, "
        "teacher_entropy, teacher_bucket: it was scored already; pass the unscored rows (or drop those columns to score "
        "it again)."]
    assert not again.exists() and not work_dir_for(again).exists()


@pytest.mark.parametrize("marks, what", [({"trims_student": "dream", "is_causal": False}, "a dream student of trims_hf"),
                                         ({"is_causal": False}, "its config says is_causal: false")])
def test_a_bidirectional_teacher_is_refused_before_it_loads(marks, what, teacher_dir, data_file, tmp_path, capsys,
                                                            no_model_load):
    """A trims student (or any model attending both ways) sees the token it scores: its NLL would be no teacher's."""
    student = tmp_path / "student"
    shutil.copytree(teacher_dir, student)
    config = json.loads((student / "config.json").read_text())
    (student / "config.json").write_text(json.dumps({**config, **marks}))
    out = tmp_path / "out"
    argv = ["score", "--teacher", str(student), "--dataset", str(data_file), "--prompt-column", "question",
            "--completion-column", "answer", "--output", str(out)]
    assert trims_main(argv) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"error: teacher {student}: {what}, so it attends to the tokens it scores; score with a causal language model "
        "(an autoregressive teacher)."]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["student"]
    with pytest.raises(ValueError, match=f"^teacher {student}: {what}"):
        load_teacher(str(student))


def test_a_composite_teachers_text_model_is_checked_too():
    """Composite configs (Gemma 3's) keep the language model's settings in text_config."""
    from transformers import Gemma3Config, LlamaConfig

    from trims_hf.data.teacher import check_causal_teacher

    check_causal_teacher(LlamaConfig(), "causal")  # no is_causal at all: a causal LM
    composite = Gemma3Config()
    check_causal_teacher(composite, "composite")
    composite.text_config.is_causal = False
    with pytest.raises(ValueError, match="^teacher composite: its config says is_causal: false"):
        check_causal_teacher(composite, "composite")


def test_a_row_past_the_teachers_positions_is_refused_and_rows_within_them_are_scored(tokenizer, data_file, tmp_path,
                                                                                      capsys):
    """A --teacher-max-length above the teacher's positions is allowed for the rows that fit in them."""
    teacher = save_teacher(tokenizer, tmp_path / "short-teacher", context=160)
    flags = ["score", "--teacher", str(teacher), "--prompt-column", "question", "--completion-column", "answer",
             "--teacher-max-length", "4096"]
    assert trims_main([*flags, "--dataset", str(data_file), "--output", str(tmp_path / "out")]) == 2
    assert error_lines(capsys.readouterr().err) == [
        "error: row 0: 198 teacher tokens (108 prompt + 90 completion), past the 160 positions the teacher's config "
        "gives (its max_position_embeddings and RoPE scaling); pass a --teacher-max-length of at most 160 (--truncate "
        "cuts the completion to it), or drop the row."]
    assert not (tmp_path / "out").exists()
    short = write_jsonl(tmp_path / "short.jsonl", [{"question": "What is 2 + 2?", "answer": "It is 4."}])
    assert trims_main([*flags, "--dataset", str(short), "--output", str(tmp_path / "ok")]) == 0
    assert len(load_dataset(str(tmp_path / "ok"), split="train")) == 1


def test_the_teachers_tokenizer_and_config_are_read_once(teacher_dir, data_file, tmp_path, monkeypatch):
    """The rows are checked with the teacher's tokenizer and config before its weights load; the load reuses them (a
    GGUF file's metadata, its whole vocabulary, takes seconds to parse on each read)."""
    from trims_hf.data import teacher as teacher_module

    reads = Counter()
    for name in ("AutoTokenizer", "AutoConfig"):
        def counted(*args, _load=getattr(teacher_module, name).from_pretrained, _name=name, **kwargs):
            reads[_name] += 1
            return _load(*args, **kwargs)

        monkeypatch.setattr(teacher_module, name, SimpleNamespace(from_pretrained=counted))
    assert trims_main(score_args(teacher_dir, data_file, tmp_path / "out")) == 0
    assert reads == {"AutoTokenizer": 1, "AutoConfig": 1}


def test_a_teacher_without_a_chat_template_is_said_to_render_plain_text(tokenizer, data_file, tmp_path, capsys):
    note = "note: the teacher's tokenizer has no chat template, so the prompts are rendered as plain text"
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    teacher = save_teacher(plain, tmp_path / "plain-teacher")
    assert trims_main(score_args(teacher, data_file, tmp_path / "out")) == 0
    assert note in capsys.readouterr().err
    assert read_card_metadata(tmp_path / "out")["prompt_format"] == "plain"
    assert trims_main(score_args(save_teacher(tokenizer, tmp_path / "chat-teacher"), data_file, tmp_path / "chat")) == 0
    assert note not in capsys.readouterr().err
    assert read_card_metadata(tmp_path / "chat")["prompt_format"] == "chat_template"
