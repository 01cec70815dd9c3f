"""Local copies of the harness's Hub data sets, shaped like the Hub versions (the ``*_local`` groups' loader).

lm_eval calls these through ``custom_dataset: !function local_data.NAME`` with the run's metadata as
keyword arguments; only ``data_dir`` is ours, the rest (model arguments, versions) is ignored.
"""

from __future__ import annotations

import json
from typing import Any

from datasets import Dataset, DatasetDict, load_dataset

from trims_hf.evaluation.harness import LOCAL_FILES, data_file

# google-research-datasets/mbpp "full": which task ids form each split.
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}


def gsm8k(data_dir: str | None = None, **_: Any) -> DatasetDict:
    """openai/gsm8k (main): train and test, fields question and answer."""
    files = {split: str(data_file(name, data_dir)) for split, name in LOCAL_FILES["gsm8k"].items()}
    return load_dataset("json", data_files=files)


def math500(data_dir: str | None = None, **_: Any) -> DatasetDict:
    """HuggingFaceH4/MATH-500: the test split (problem, solution, answer, subject, level, unique_id)."""
    files = {split: str(data_file(name, data_dir)) for split, name in LOCAL_FILES["minerva_math500"].items()}
    return load_dataset("json", data_files=files)


def mbpp(data_dir: str | None = None, **_: Any) -> DatasetDict:
    """google-research-datasets/mbpp (full): prompt, test, validation and train splits by task id."""
    with data_file(LOCAL_FILES["mbpp"]["full"], data_dir).open() as handle:
        rows = [json.loads(line) for line in handle]
    return DatasetDict({
        split: Dataset.from_list([row for row in rows if low <= row["task_id"] <= high])
        for split, (low, high) in MBPP_SPLITS.items()
    })
