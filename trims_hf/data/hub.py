"""Local folders and the Hub: atomic folder writes, dataset cards, early push checks, upload.

The folder layout (``data/train-*.parquet`` + ``README.md``) is what ``datasets.load_dataset(folder)``
and the Hub both read, so the local copy and the pushed repo are the same files. Write access is
checked before any expensive work, so a long scoring run never ends in an auth error.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from datasets import Dataset, load_dataset
from huggingface_hub import DatasetCard, DatasetCardData, HfApi, constants, get_token
from huggingface_hub.errors import HfHubHTTPError

from ..reports import markdown_table
from ..sources import LOCAL_DATA_SUFFIXES

PAPER_TITLE = "TRIMS: Trajectory-Ranked Instruction Masked Supervision for Diffusion Language Models"
PAPER_AUTHORS = ("Lingjie Chen", "Ruizhong Qiu", "Yuyu Fan", "Yanjun Zhao", "Hanghang Tong")
PAPER_CITATION = f"""@misc{{chen2026trims,
  title  = {{{PAPER_TITLE}}},
  author = {{{" and ".join(PAPER_AUTHORS)}}},
  year   = {{2026}}
}}"""
METADATA_KEY = "trims"
"""YAML key of the card that holds the scoring facts (teacher, buckets, thresholds, formatting)."""
MAX_SHARD_BYTES = 500 * 2**20
TABLE_FORMATS = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".parquet": "parquet", ".csv": "csv",
                 ".tsv": "csv", ".arrow": "arrow"}
"""The tabular files a data set folder may hold, by the ``datasets`` builder that reads them."""
TABLE_BUILDERS = frozenset(TABLE_FORMATS.values())
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")
"""Suffixes of a compressed file, which ``datasets`` reads by the suffix before (``rows.jsonl.gz``)."""
LOCAL_BUILDERS = {suffix: TABLE_FORMATS[suffix] for suffix in LOCAL_DATA_SUFFIXES}
"""The single files a source may be, by their builder."""


def load_source_dataset(source: str, split: str = "train", limit: int | None = None, *, flag: str = "dataset") -> Dataset:
    """Load a Hub dataset id, a local dataset folder, or a local ``.jsonl`` / ``.json`` / ``.parquet`` file.

    A missing split, an unreadable file or no rows (every caller scores or trains on them) raises
    :class:`trims_hf.sources.SourceError` naming ``flag`` (the argument or command-line flag the user gave the
    source with).
    """
    from ..sources import SourceError

    builder = LOCAL_BUILDERS.get(Path(source).suffix)
    local_file = bool(builder) and Path(source).is_file()
    no_rows = SourceError(f"{flag} {source}: no rows" + ("." if local_file else f" in split {split!r}."))
    if local_file and split != "train":
        raise SourceError(f"{flag} {source} is a single file, whose one split is 'train'; got split={split!r}.")
    if local_file and not Path(source).stat().st_size:
        raise no_rows
    if local_file and Path(source).suffix == ".jsonl":
        check_jsonl_rows_are_objects(Path(source), flag)
    if local_file and Path(source).suffix == ".parquet" and _parquet_rows(Path(source)) == 0:
        raise no_rows  # datasets' reader fails on an empty table as pyarrow writes it ("BatchSize must be greater than 0")
    table_folder = Path(source).is_dir() and not saved_with_datasets(source)  # not one save_to_disk wrote
    if table_folder:
        check_one_table_format(Path(source), flag)
    try:
        if local_file:
            dataset = load_dataset(builder, data_files=str(source), split="train")
        elif saved_with_datasets(source):
            dataset = _saved_split(source, split, flag)
        else:
            dataset = load_dataset(source, split=split)
    except SourceError:
        raise
    except Exception as error:  # datasets' and pyarrow's errors of what is there
        message = str(error)
        folder = Path(source).is_dir()
        if type(error).__name__ == "EmptyDatasetError":
            raise SourceError(f"{flag} {source}: no data files" + (" in the folder (.parquet, .jsonl, .json, .csv, ...)."
                                                                   if folder else ".")) from None
        if "corresponds to no data" in message:
            raise no_rows from None
        reason = next(iter(str(error.__cause__ or error).strip().splitlines()), type(error).__name__)
        if "JSON parse error" in reason and (bad := _first_bad_json_line(Path(source))):
            raise SourceError(f"{flag} {bad}") from None
        if folder and "BatchSize must be greater than 0" in reason and (empty := _empty_parquet_files(Path(source))):
            raise SourceError(f"{flag} {source}: empty parquet file(s) in it ({', '.join(empty)}), which datasets "
                              "cannot read in a folder; remove them.") from None
        if local_file:  # a malformed file (pyarrow's ArrowInvalid is a ValueError too)
            raise SourceError(f"{flag} {source}: cannot be read as a {Path(source).suffix} file ({reason}).") from None
        if table_folder and (misread := _not_a_table(Path(source))):
            raise SourceError(f"{flag} {source}: {misread}") from None
        if table_folder and "column names don't match" in str(error.__cause__ or error) and (
                odd := _files_of_other_columns(Path(source))):
            raise SourceError(f"{flag} {source}: {odd}") from None
        if isinstance(error, ValueError) and "split" in message.lower():  # datasets lists the splits there are
            raise SourceError(f"{flag} {source} has no split={split!r} ({message.splitlines()[0]}).") from None
        if folder:  # a malformed file in it, or a saved split without rows
            raise SourceError(f"{flag} {source}: cannot be read as a data set folder ({type(error).__name__}: "
                              f"{reason}).") from None
        raise
    if table_folder and (misread := _not_a_table(Path(source), dataset.info.builder_name)):
        raise SourceError(f"{flag} {source}: {misread}")
    if not len(dataset):
        raise no_rows
    return dataset.select(range(min(limit, len(dataset)))) if limit is not None else dataset


def data_files(source: Path, suffixes: Collection[str]) -> list[Path]:
    """The files ``datasets`` would read from ``source`` with one of ``suffixes``: the file itself, or a folder's
    files at any depth, sorted, but those under a hidden or ``__`` name, which ``datasets`` skips."""
    if not source.is_dir():
        return [source] if source.suffix in suffixes else []
    return sorted(path for path in source.rglob("*") if path.suffix in suffixes and path.is_file()
                  and not any(part.startswith((".", "__")) for part in path.relative_to(source).parts))


def _not_a_table(folder: Path, builder: str | None = None) -> str | None:
    """Why a folder is not read as a table, when ``datasets`` reads it (``builder``), or would read one of its splits
    (None: inferred from the files), with another reader. It picks a folder's reader by its most common type of file,
    so two .txt notes beside one .jsonl make a text data set of one ``text`` column, and the user would otherwise be
    told of a missing column, or of a missing split where notes named like a split get a reader of their own. None
    when the reader is a table's."""
    if builder in TABLE_BUILDERS:
        return None
    from datasets.data_files import DataFilesDict, get_data_patterns
    from datasets.load import infer_module_for_data_files_list

    try:  # the files datasets takes for each split (by their names, README.md left out)
        splits = [list(paths) for paths in DataFilesDict.from_patterns(get_data_patterns(str(folder)),
                                                                       base_path=str(folder)).values()]
    except Exception:  # noqa: BLE001 - no files for any split: the reader's own error stands
        return None
    def reader(files: list[str]) -> str | None:
        try:
            return infer_module_for_data_files_list(files)[0]
        except Exception:  # noqa: BLE001 - an archive it cannot open: the reader's own error stands
            return None

    builder = builder or next((found for found in map(reader, splits) if found not in (None, *TABLE_BUILDERS)), None)
    if builder is None:
        return None
    kinds = Counter("".join(Path(path).suffixes[-2:]) if Path(path).suffix in COMPRESSIONS else Path(path).suffix
                    for files in splits for path in files)
    found = ", ".join(f"{n} {kind or '(no suffix)'}" for kind, n in sorted(kinds.items()))
    return (f"datasets reads it as {builder!r} files, not as a table (its files: {found}): it reads a folder with the "
            "reader of its most common type of file; keep only the data's files (.jsonl, .json, .parquet, .csv) in "
            "it, or pass a file.")


def _first_columns(path: Path) -> tuple[str, ...] | None:
    """The columns of a table file's first row (a parquet file's schema, a CSV header); None where it cannot be told
    cheaply (a .json document past 64 MiB, a file that does not parse)."""
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            return tuple(pq.read_schema(path).names)
        with path.open(encoding="utf-8-sig") as lines:
            if path.suffix in (".csv", ".tsv"):
                return tuple(next(lines).rstrip("\r\n").split("\t" if path.suffix == ".tsv" else ","))
            first = next((line for line in lines if line.strip()), "")
            if first.lstrip().startswith("{"):
                try:
                    return tuple(json.loads(first))  # JSON Lines, or a one-line document
                except ValueError:
                    pass  # a document over several lines
        if path.suffix == ".json" and path.stat().st_size <= 64 * 2**20:
            document = json.loads(path.read_text(encoding="utf-8-sig"))
            row = document[0] if isinstance(document, list) and document else document
            return tuple(row) if isinstance(row, dict) else None
    except (OSError, ValueError, StopIteration, IndexError):
        return None
    return None


def _files_of_other_columns(folder: Path) -> str | None:
    """Which of a folder's table files hold other columns than most (``datasets`` reads its files as one table, and
    says only "Couldn't cast"): a notes or metadata .json beside the data. None when it cannot be told."""
    files = data_files(folder, TABLE_FORMATS)
    columns = {path: found for path in files if (found := _first_columns(path)) is not None}
    kinds = Counter(frozenset(found) for found in columns.values())  # datasets matches columns by name
    if len(kinds) < 2:
        return None
    common = kinds.most_common(1)[0][0]
    odd = [path for path, found in columns.items() if frozenset(found) != common]
    named = "; ".join(f"{path.relative_to(folder)}: {', '.join(columns[path]) or 'none'}" for path in odd[:3])
    rest = next(found for found in columns.values() if frozenset(found) == common)
    others = len(columns) - len(odd)
    return (f"its files hold different columns ({named}{'; ...' if len(odd) > 3 else ''}; the other "
            f"{'file' if others == 1 else f'{others} files'}: {', '.join(rest)}), and datasets reads a folder's files "
            "as one table; keep only the data's files in it, or pass a file.")


def check_one_table_format(folder: Path, flag: str) -> None:
    """A folder's data files are all read by one builder: ``datasets`` infers the folder's format from its most
    common data file type and skips the rest, so rows in a second format would be dropped without a word."""
    from ..sources import SourceError

    counts: dict[str, dict[str, int]] = {}
    for path in data_files(folder, TABLE_FORMATS):
        by_suffix = counts.setdefault(TABLE_FORMATS[path.suffix], {})
        by_suffix[path.suffix] = by_suffix.get(path.suffix, 0) + 1
    if len(counts) > 1:
        found = ", ".join(f"{n} {suffix}" for _, formats in sorted(counts.items()) for suffix, n in sorted(formats.items()))
        raise SourceError(f"{flag} {folder}: the folder holds data files of several formats ({found}), and datasets "
                          "reads only one of them, dropping the others' rows; keep one format in it, or pass a file.")


def _parquet_rows(path: Path) -> int | None:
    """The rows a parquet file's footer records; None when it cannot be read (the reader then says why)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # noqa: BLE001 - pyarrow's errors of a malformed file, reported by the load that follows
        return None


def _first_bad_json_line(source: Path) -> str | None:
    """Where a JSON Lines file (or a folder's; a ``.json`` file counts when it starts with an object, not an array)
    pyarrow cannot parse has its first line that is not JSON, as ``"PATH: line N is not valid JSON (...)."``: pyarrow
    counts rows within its block of a file, so the row it names is not the file's past the first block. None where
    every line parses (the reader's own message stands)."""
    for path in data_files(source, (".jsonl", ".json", ".ndjson")):
        with path.open(encoding="utf-8-sig", errors="replace") as lines:
            first = True
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                if first and not line.lstrip().startswith("{"):
                    break  # one JSON document (an array): its lines are not rows
                first = False
                try:
                    json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as error:
                    return f"{path}: line {number} is not valid JSON ({error.msg}, column {error.colno})."
    return None


def _empty_parquet_files(source: Path) -> list[str]:
    """A folder's parquet files with no rows: ``datasets`` fails on one that pyarrow wrote from an empty table (one
    empty row group: "BatchSize must be greater than 0")."""
    return [str(path.relative_to(source)) for path in data_files(source, (".parquet",)) if _parquet_rows(path) == 0]


def saved_with_datasets(source: str) -> bool:
    """A folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (which ``load_dataset`` refuses)."""
    folder = Path(source)
    return folder.is_dir() and any((folder / name).is_file() for name in ("state.json", "dataset_dict.json"))


def _saved_split(source: str, split: str, flag: str) -> Dataset:
    """``split`` of a ``save_to_disk`` folder; a saved single ``Dataset`` is the ``train`` split."""
    from datasets import DatasetDict, load_from_disk

    from ..sources import SourceError

    saved = load_from_disk(source)
    if isinstance(saved, DatasetDict):
        if split not in saved:
            raise SourceError(f"{flag} {source} has no split={split!r} (its splits: {', '.join(saved)}).")
        return saved[split]
    if split != "train":
        raise SourceError(f"{flag} {source} holds one data set, read as the split 'train'; got split={split!r}.")
    return saved


def check_jsonl_rows_are_objects(path: Path, flag: str) -> None:
    """A JSONL row is an object of columns (or the file one array of them): datasets reads a file of other JSON values
    (numbers, strings, arrays of those) into one ``text`` column, and the user would be told of a column the file does
    not have. The first row is read."""
    from ..sources import SourceError

    with path.open("rb") as lines:  # every line UTF-8, as JSON is (a bad byte would stop the run at its row)
        for number, line in enumerate(lines):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise SourceError(f"{flag} {path}: line {number + 1} is not UTF-8 text (byte {error.start}: "
                                  f"{line[error.start:error.start + 1]!r}); JSON Lines are UTF-8.") from None
    with path.open(encoding="utf-8") as lines:
        first = next((line for line in lines if line.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return  # the reader says what is malformed, and where
    if not isinstance(row, dict) and not (isinstance(row, list) and row and isinstance(row[0], dict)):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(row), "a number")
        raise SourceError(f"{flag} {path}: row 0 is {kind}, not an object of columns "
                          '(e.g. {"prompt": ..., "completion": ...}).')


class HubAccessError(RuntimeError):
    """The Hub cannot be written to (offline, no token, or no write access); raised before any work starts."""


def check_push_access(repo_id: str, token: str | None = None) -> str:
    """Return the user name if ``token`` (or the saved login) may write to ``repo_id``'s namespace.

    Checks offline mode, token presence, validity (``whoami``) and the token's role or fine-grained
    ``repo.write`` scope for the namespace, with a message saying what to do in each case.
    """
    if constants.HF_HUB_OFFLINE:
        raise HubAccessError(f"Cannot push to {repo_id}: HF_HUB_OFFLINE is set. Unset it, or drop --push-to-hub.")
    token = token or get_token()
    if not token:
        raise HubAccessError(f"Cannot push to {repo_id}: no Hugging Face token. Run `hf auth login` or pass --token.")
    try:
        info = HfApi().whoami(token=token)
    except HfHubHTTPError as error:
        raise HubAccessError(f"Cannot push to {repo_id}: the token was rejected by the Hub ({error}).") from error
    except Exception as error:  # transport errors (the HTTP client's own classes, OSError): the Hub cannot be reached
        raise HubAccessError(
            f"Cannot push to {repo_id}: the Hub is unreachable ({error}). Check the network or drop --push-to-hub.") from error
    namespace = repo_id.split("/")[0] if "/" in repo_id else info["name"]
    owners = {info["name"], *(org["name"] for org in info.get("orgs", []))}
    if namespace not in owners:
        raise HubAccessError(f"Cannot push to {repo_id}: user {info['name']} is not a member of '{namespace}'.")
    access = info.get("auth", {}).get("accessToken", {})
    if access.get("role") == "read" or (access.get("role") == "fineGrained" and not _fine_grained_write(access, namespace)):
        raise HubAccessError(
            f"Cannot push to {repo_id}: the token '{access.get('displayName')}' has no write access to '{namespace}'.")
    return info["name"]


def _fine_grained_write(access: Mapping[str, Any], namespace: str) -> bool:
    grants = access.get("fineGrained", {})
    scoped = [s for s in grants.get("scoped", []) if s.get("entity", {}).get("name") == namespace]
    return any("repo.write" in s.get("permissions", []) for s in scoped) or "repo.write" in grants.get("global", [])


def write_folder_atomically(folder: str | os.PathLike, fill: Callable[[Path], None], overwrite: bool = False) -> Path:
    """Build a folder with ``fill(temp_path)`` in a temporary sibling, then rename it into place.

    A crash or error leaves no half-written ``folder``; an existing one is replaced only with ``overwrite``.
    The staging folder is made with ``mkdir`` (not ``mkdtemp``, whose folders are private), so the result
    has the permissions the user's umask gives any new folder.
    """
    folder = Path(folder)
    if folder.exists() and not overwrite:
        raise FileExistsError(f"{folder} already exists; choose another output folder or pass overwrite=True.")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.tmp")
    staging.mkdir()
    try:
        fill(staging)
        if folder.exists():
            old = folder.with_name(f".{folder.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(folder, old)
            os.replace(staging, folder)
            shutil.rmtree(old)
        else:
            os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def save_dataset_folder(dataset: Dataset, folder: str | os.PathLike, card: DatasetCard, split: str = "train",
                        overwrite: bool = False) -> Path:
    """Write ``dataset`` as parquet shards under ``data/`` plus the card as ``README.md``, atomically."""
    num_shards = max(1, -(-dataset.data.nbytes // MAX_SHARD_BYTES))

    def fill(staging: Path) -> None:
        (staging / "data").mkdir()
        for shard in range(num_shards):
            part = dataset.shard(num_shards, shard, contiguous=True)
            part.to_parquet(str(staging / "data" / f"{split}-{shard:05d}-of-{num_shards:05d}.parquet"))
        card.save(staging / "README.md")

    return write_folder_atomically(folder, fill, overwrite)


def push_folder(folder: str | os.PathLike, repo_id: str, repo_type: str = "dataset", token: str | None = None,
                private: bool | None = None, commit_message: str = "Upload with trims_hf") -> str:
    """Create the repo if needed and upload the folder; the local folder is kept whatever happens."""
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
    commit = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type=repo_type, commit_message=commit_message)
    return commit.commit_url


def scored_dataset_card(metadata: Mapping[str, Any], license: str | None = None, pretty_name: str | None = None) -> DatasetCard:
    """A dataset card whose YAML holds the scoring facts under ``trims:``.

    No ``configs:`` entry: the ``data/<split>-*.parquet`` layout is found by convention, and with a
    ``configs:`` entry datasets 5.2 caches a local folder by the pattern only, so a rewritten folder
    (or another folder of the same name) loads stale rows.
    """
    data = DatasetCardData(
        license=license,
        pretty_name=pretty_name,
        tags=["trims", "diffusion-language-models", "teacher-scores"],
        **{METADATA_KEY: dict(metadata)},
    )
    facts = "\n".join(f"- **{key}**: `{value}`" for key, value in metadata.items()
                      if key not in ("thresholds", "bucket_statistics"))
    per_bucket = metadata.get("bucket_statistics") or []
    table = markdown_table(["bucket", "tokens", "mean NLL", "share of NLL"],
                           [[str(b["bucket"]), f"{b['tokens']:,}", "—" if b["mean_nll"] is None else f"{b['mean_nll']:.4f}",
                             f"{b['nll_share']:.1%}"] for b in per_bucket])
    buckets = f"""
Per bucket (0 = revealed first), over the {metadata.get('quantile_tokens', 'all')} tokens the quantiles were cut on:

{table}
""" if per_bucket else ""
    content = f"""---
{data.to_yaml()}
---

# {pretty_name or "TRIMS teacher-scored dataset"}

Each row holds a prompt and a completion, and for every teacher token of the completion its character
span in the completion text (`teacher_token_start`, `teacher_token_end`, end exclusive), the teacher's
negative log-likelihood `-log p_T(y_i | x, y_<i)` (`teacher_nll`), the entropy of the teacher's predictive
distribution at that position (`teacher_entropy`), and an equal-mass difficulty bucket (`teacher_bucket`,
0 = revealed first), as in TRIMS §3.1-3.2. With `quantile_tokens: kept` the quantiles are cut over the
completion tokens within `train_max_length` teacher tokens (the tokens training sees); the others get
their bucket from the same thresholds.

## Scoring

{facts}
{buckets}
Bucket thresholds (the first score of buckets 1..K-1 in decode order) are in the YAML header under
`{METADATA_KEY}.thresholds`. Student-side buckets are recomputed from the spans for each student tokenizer.

## Citation

```bibtex
{PAPER_CITATION}
```
"""
    return DatasetCard(content)


def read_card_metadata(folder_or_repo: str | os.PathLike) -> dict[str, Any]:
    """The ``trims:`` facts (teacher, buckets, thresholds, formatting) of a dataset folder's or Hub repo's card."""
    source = Path(folder_or_repo) / "README.md" if Path(folder_or_repo).is_dir() else str(folder_or_repo)
    return DatasetCard.load(source, repo_type="dataset").data.to_dict().get(METADATA_KEY, {})
