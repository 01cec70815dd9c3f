"""Model and data set sources are checked before any load: one line naming the flag, fast, offline-aware."""

from __future__ import annotations

import httpx2 as httpx
import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import RepositoryNotFoundError

from trims_hf.sources import SourceError, check_dataset_source, check_model_source


@pytest.fixture
def unreachable_hub(monkeypatch):
    def refuse(self, repo_id, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(HfApi, "repo_info", refuse)


@pytest.mark.parametrize("value", ["./missing-model", "/no/such/folder", "~/nowhere/x", "a/b/c", "model.gguf"])
def test_missing_local_model_path_names_flag_and_path(value, unreachable_hub):
    with pytest.raises(SourceError, match=rf"^--model {value}: no such file or folder\.$"):
        check_model_source("--model", value)


def test_folder_without_config_lists_its_gguf_files(tmp_path):
    (tmp_path / "weights.gguf").write_bytes(b"")
    with pytest.raises(SourceError, match=r"no config.json; it holds weights.gguf"):
        check_model_source("--teacher", str(tmp_path))
    check_model_source("--teacher", str(tmp_path), gguf_file="weights.gguf")
    check_model_source("--teacher", str(tmp_path / "weights.gguf"))
    (tmp_path / "config.json").write_text("{}")
    check_model_source("--teacher", str(tmp_path))


def test_unreachable_hub_says_what_works_offline(unreachable_hub, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    with pytest.raises(SourceError) as error:
        check_model_source("--teacher", "Qwen/Qwen3-8B-not-cached")
    message = str(error.value)
    assert message.startswith("--teacher Qwen/Qwen3-8B-not-cached: ") and "unreachable" in message
    assert "local model folder or .gguf file" in message and "\n" not in message
    with pytest.raises(SourceError, match=r"--dataset org/data: .*unreachable.*local \.jsonl/\.json/\.parquet file"):
        check_dataset_source("--dataset", "org/data")


def test_offline_mode_fails_without_network(monkeypatch):
    def never(self, *args, **kwargs):
        raise AssertionError("the Hub was contacted in offline mode")

    monkeypatch.setattr(HfApi, "repo_info", never)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(SourceError, match="HF_HUB_OFFLINE is set"):
        check_model_source("--model", "org/not-cached")


def test_unknown_hub_repo(monkeypatch):
    def missing(self, repo_id, **kwargs):
        raise RepositoryNotFoundError("404 Repository Not Found", response=httpx.Response(404, request=httpx.Request("GET", "https://hf.co")))

    monkeypatch.setattr(HfApi, "repo_info", missing)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    with pytest.raises(SourceError, match=r"^--model org/typo: no such model on the Hub"):
        check_model_source("--model", "org/typo")


def test_local_data_files(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    check_dataset_source("--dataset", str(tmp_path / "rows.jsonl"))
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(SourceError, match=r"unsupported file type '\.csv'"):
        check_dataset_source("--dataset", str(tmp_path / "rows.csv"))
    with pytest.raises(SourceError, match=r"rows2.jsonl: no such file or folder"):
        check_dataset_source("--dataset", str(tmp_path / "rows2.jsonl"))
