"""Dataset folder + card: atomic writes, load_dataset round trip, early push checks, the `trims score` command."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
from datasets import Dataset, Features, Value, load_dataset
from helpers_teachers import make_teacher, save_teacher

from trims_hf.cli import main as trims_main
from trims_hf.data import hub
from trims_hf.data import score_job as scoring
from trims_hf.data.hub import HubAccessError, check_push_access, read_card_metadata, save_dataset_folder, scored_dataset_card
from trims_hf.data.score_job import SCORE_FEATURES


def test_folder_round_trips_through_load_dataset_with_card(tmp_path):
    rows = {"prompt": ["a", "b"], "completion": ["x y", "z"], "teacher_token_start": [[0, 1], [0]],
            "teacher_token_end": [[1, 3], [1]],
            "teacher_nll": [[0.5, 1.5], [2.0]], "teacher_entropy": [[1.0, 1.0], [0.1]], "teacher_bucket": [[1, 0], [0]]}
    data = Dataset.from_dict(rows, features=Features({"prompt": Value("string"), "completion": Value("string"),
                                                      **SCORE_FEATURES}))
    card = scored_dataset_card({"teacher": "t", "num_buckets": 2, "thresholds": [1.5]}, license="mit", pretty_name="P")
    folder = save_dataset_folder(data, tmp_path / "scored", card)
    loaded = load_dataset(str(folder), split="train")
    assert loaded.to_dict() == data.to_dict() and loaded.features["teacher_bucket"] == SCORE_FEATURES["teacher_bucket"]
    assert read_card_metadata(folder) == {"teacher": "t", "num_buckets": 2, "thresholds": [1.5]}
    readme = (folder / "README.md").read_text()
    assert "license: mit" in readme and hub.PAPER_TITLE in readme and "Hanghang Tong" in readme
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scored"]  # no temporary sibling left
    with pytest.raises(FileExistsError):
        save_dataset_folder(data, folder, card)


def test_failed_write_leaves_no_folder(tmp_path):
    def fill(staging):
        (staging / "half.parquet").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        hub.write_folder_atomically(tmp_path / "out", fill)
    assert list(tmp_path.iterdir()) == []


def whoami(role: str, orgs=(), scoped=()):
    return lambda self, token=None, **_: {"name": "me", "orgs": [{"name": o} for o in orgs],
                                          "auth": {"accessToken": {"displayName": "tok", "role": role,
                                                                   "fineGrained": {"scoped": list(scoped), "global": []}}}}


@pytest.mark.parametrize("offline, token, role, repo, message", [
    (True, "t", "write", "me/x", "HF_HUB_OFFLINE"),
    (False, None, "write", "me/x", "no Hugging Face token"),
    (False, "t", "read", "me/x", "no write access"),
    (False, "t", "write", "other/x", "not a member of 'other'"),
    (False, "t", "fineGrained", "me/x", "no write access"),
])
def test_push_access_is_refused_with_a_clear_reason(monkeypatch, offline, token, role, repo, message):
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(hub, "get_token", lambda: None)
    monkeypatch.setattr(hub.HfApi, "whoami", whoami(role))
    with pytest.raises(HubAccessError, match=message):
        check_push_access(repo, token)


def test_push_access_granted_for_write_tokens(monkeypatch):
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub.HfApi, "whoami", whoami("write", orgs=["lab"]))
    assert check_push_access("lab/x", "t") == "me"
    scoped = [{"entity": {"type": "org", "name": "lab"}, "permissions": ["repo.write"]}]
    monkeypatch.setattr(hub.HfApi, "whoami", whoami("fineGrained", orgs=["lab"], scoped=scoped))
    assert check_push_access("lab/x", "t") == "me"


def test_unreachable_hub_is_reported_before_scoring(monkeypatch, tokenizer, gsm8k_rows, tmp_path):
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    teacher = make_teacher(tokenizer)
    calls = []
    teacher.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(HubAccessError, match="unreachable|rejected"):
        scoring.build_scored_dataset(Dataset.from_list(gsm8k_rows[:2]), tmp_path / "out", "tiny", push_to_hub="me/x",
                                     token="hf_fake", loaded_teacher=(teacher, tokenizer))
    assert calls == [] and list(tmp_path.iterdir()) == []


def test_failed_push_keeps_the_local_copy(monkeypatch, tokenizer, gsm8k_rows, tmp_path):
    monkeypatch.setattr(scoring, "check_push_access", lambda repo, token: "me")

    def refuse(*_, **__):
        raise OSError("connection reset")

    monkeypatch.setattr(scoring, "push_folder", refuse)
    with pytest.raises(RuntimeError, match="kept at .*out"):
        scoring.build_scored_dataset(Dataset.from_list(gsm8k_rows[:2]), tmp_path / "out", "tiny", push_to_hub="me/x",
                                     loaded_teacher=(make_teacher(tokenizer), tokenizer))
    assert len(load_dataset(str(tmp_path / "out"), split="train")) == 2


def test_trims_score_command_on_a_local_jsonl(tokenizer, gsm8k_rows, tmp_path):
    teacher = save_teacher(tokenizer, tmp_path / "teacher")
    source = tmp_path / "data.jsonl"
    source.write_text("".join(json.dumps({"q": r["prompt"], "a": r["completion"], "id": i}) + "\n"
                              for i, r in enumerate(gsm8k_rows)))
    out = tmp_path / "scored"
    code = trims_main(["score", "--teacher", str(teacher), "--dataset", str(source), "--prompt-column", "q",
                       "--completion-column", "a", "--num-buckets", "4", "--metric", "entropy",
                       "--bucket-ordering", "easy_to_hard",
                       "--prompt-format", "Q: {prompt}\nA:", "--limit", "5", "--output", str(out)])
    assert code == 0
    loaded = load_dataset(str(out), split="train")
    assert loaded["id"] == list(range(5)) and loaded["prompt"] == [r["prompt"] for r in gsm8k_rows[:5]]
    meta = read_card_metadata(out)
    assert (meta["num_buckets"], meta["metric"], meta["bucket_ordering"], meta["prompt_template"]) == (
        4, "entropy", "easy_to_hard", "Q: {prompt}\nA:")
    assert len(meta["thresholds"]) == 3 and (meta["teacher"], meta["teacher_source"]) == ("teacher", "local folder")
    assert trims_main(["score", "--teacher", str(teacher), "--dataset", str(source), "--output", str(out)]) == 2  # missing column


@pytest.mark.parametrize("umask, mode", [(0o022, 0o755), (0o027, 0o750)])
def test_folders_follow_the_umask_like_mkdir(tmp_path, umask, mode):
    """Scored folders get what mkdir would give (tempfile.mkdtemp alone would leave them 0700)."""
    previous = os.umask(umask)
    try:
        folder = hub.write_folder_atomically(tmp_path / "scored", lambda staging: (staging / "data").mkdir())
    finally:
        os.umask(previous)
    assert stat.S_IMODE(folder.stat().st_mode) == mode and stat.S_IMODE((folder / "data").stat().st_mode) == mode


def test_a_folder_is_read_whole_or_refused_when_its_formats_differ(tmp_path):
    """datasets reads one format per folder and skips the others' files; hidden files and a README are no data."""
    from trims_hf.data.hub import load_source_dataset
    from trims_hf.sources import SourceError

    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(3)]
    folder = tmp_path / "data"
    (folder / ".cache").mkdir(parents=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    Dataset.from_list(rows[:1]).to_parquet(str(folder / ".cache" / "old.parquet"))
    (folder / "README.md").write_text("# data\n")
    assert load_source_dataset(str(folder))["prompt"] == ["p0", "p1", "p2"]
    Dataset.from_list(rows[:2]).to_parquet(str(folder / "more.parquet"))
    with pytest.raises(SourceError, match=r"several formats \(1 \.jsonl, 1 \.parquet\)"):
        load_source_dataset(str(folder), flag="--dataset")


ROW = '{"prompt": "p", "completion": "c"}\n'
NOTE = "a note\n"
FOLDERS_READ_OR_NOT = {  # files -> the reader datasets takes instead of a table's and the files counted, or None
    "notes outnumber the data": ({"data.jsonl": ROW, "a.txt": NOTE, "b.txt": NOTE}, "'text' files, not as a table "
                                 r"\(its files: 1 \.jsonl, 2 \.txt\)"),
    "markdown notes": ({"data.jsonl": ROW, "a.md": NOTE, "b.md": NOTE}, r"'harbor' files, not as a table \(its files: "
                       r"1 \.jsonl, 2 \.md\)"),
    "notes named like a split": ({"train.jsonl": ROW, "eval_notes.txt": NOTE}, r"'text' files, not as a table \(its "
                                 r"files: 1 \.jsonl, 1 \.txt\)"),
    "compressed notes": ({"data.jsonl": ROW, "a.txt.gz": None, "b.txt.gz": None}, r"'text' files, not as a table "
                         r"\(its files: 1 \.jsonl, 2 \.txt\.gz\)"),
    "a tie": ({"data.jsonl": ROW, "a.txt": NOTE}, None),
    "files no reader takes": ({"data.jsonl": ROW, "a.yaml": NOTE, "b.yaml": NOTE, "c.yaml": NOTE}, None),
    "the train split's own file": ({"train.jsonl": ROW, "a.txt": NOTE, "b.txt": NOTE}, None),
}


@pytest.mark.parametrize("case", FOLDERS_READ_OR_NOT)
def test_a_folder_that_datasets_reads_with_another_reader_is_refused_by_its_files(tmp_path, case):
    """datasets picks a folder's reader by its most common type of file: notes that outnumber the data make it read
    text (or fail in another reader) instead of the rows, and notes named like a split get a reader of their own (it
    said the split was missing); refused with the files counted. A tie goes to the table; files no reader takes are
    skipped, and so are those a split's name leaves out (train.jsonl is the train split alone)."""
    import gzip

    from trims_hf.data.hub import load_source_dataset
    from trims_hf.sources import SourceError

    files, refused = FOLDERS_READ_OR_NOT[case]
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "README.md").write_text("# data\n")
    for name, text in files.items():
        (folder / name).write_bytes(gzip.compress(NOTE.encode()) if text is None else text.encode())
    if refused is None:
        assert load_source_dataset(str(folder))["completion"] == ["c"]
        return
    with pytest.raises(SourceError, match=rf"^--dataset {re.escape(str(folder))}: datasets reads it as {refused}: it "
                                          r"reads a folder with the reader of its most common type of file;"):
        load_source_dataset(str(folder), flag="--dataset")


@pytest.mark.parametrize("extra, named", [
    ({"meta.json": '{"foo": 1}\n'}, r"meta\.json: foo; the other file: prompt, completion"),
    ({"meta.json": '{\n  "foo": 1\n}\n'}, r"meta\.json: foo; the other file: prompt, completion"),
    ({"sub/more.jsonl": '{"prompt": "p", "extra": 1}\n', "zz.jsonl": ROW}, r"sub/more\.jsonl: prompt, extra; the other "
                                                                         r"2 files: prompt, completion")])
def test_a_folder_whose_files_hold_other_columns_names_them(tmp_path, extra, named):
    """datasets reads a folder's table files as one table and says only "Couldn't cast" of a file with other columns
    (a metadata .json beside the rows): the file is named with its columns."""
    from trims_hf.data.hub import load_source_dataset
    from trims_hf.sources import SourceError

    folder = tmp_path / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "data.jsonl").write_text(ROW)
    for name, text in extra.items():
        (folder / name).write_text(text)
    with pytest.raises(SourceError, match=rf"^--dataset {re.escape(str(folder))}: its files hold different columns "
                                          rf"\({named}\), and datasets reads a folder's files as one table;"):
        load_source_dataset(str(folder), flag="--dataset")


def test_an_archive_datasets_cannot_open_in_a_folder_is_one_line(tmp_path):
    """Telling a folder's reader opens its archives: one that is no archive leaves the reader's own error, one line."""
    from trims_hf.data.hub import load_source_dataset
    from trims_hf.sources import SourceError

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "data.jsonl").write_text(ROW)
    for name in ("x.zip", "y.zip"):
        (folder / name).write_bytes(b"")
    with pytest.raises(SourceError, match=rf"^--dataset {re.escape(str(folder))}: cannot be read as a data set folder "
                                          r"\(BadZipFile"):
        load_source_dataset(str(folder), flag="--dataset")


def test_a_folder_names_its_empty_parquet_file_and_its_bad_json_line(tmp_path):
    """What datasets cannot read in a folder is named by file: an empty table as pyarrow writes it, and the first line
    of a JSON Lines file (a .json one too) that is not JSON, never one in a hidden folder datasets skips."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trims_hf.data.hub import load_source_dataset
    from trims_hf.sources import SourceError

    shards = tmp_path / "shards" / "data"
    shards.mkdir(parents=True)
    Dataset.from_list([{"prompt": "p", "completion": "c"}]).to_parquet(str(shards / "train-00000-of-00002.parquet"))
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "completion": pa.array([], pa.string())}),
                   shards / "train-00001-of-00002.parquet")
    with pytest.raises(SourceError, match=r"empty parquet file\(s\) in it \(data/train-00001-of-00002\.parquet\)"):
        load_source_dataset(str(tmp_path / "shards"), flag="--dataset")
    lines = tmp_path / "lines"
    (lines / ".ipynb_checkpoints").mkdir(parents=True)
    good = json.dumps({"prompt": "p" * 150, "completion": "c" * 150}) + "\n"
    (lines / ".ipynb_checkpoints" / "rows-checkpoint.json").write_text('{"prompt": }\n')
    (lines / "rows.json").write_text(good * 40000 + '{"prompt": "p", "completion": }\n')
    with pytest.raises(SourceError, match=r"lines/rows\.json: line 40001 is not valid JSON \(Expecting value"):
        load_source_dataset(str(lines), flag="--dataset")
