"""The replication itself: :class:`Replication`, the library's study runner with the word problems at several levels,
SmolLM2 converted once from its GGUF (:func:`converted`; the smoke run's stand-in a tiny Llama pretrained here), the
``select`` stage's level and the budgets of :mod:`.budgets`. Importing it loads torch."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

from ...data.schema import as_prompt_completion
from ...data.teacher import drop_gguf_marks, load_teacher
from ...evaluation.tasks.base import read_json_rows, write_json_rows
from ..arith import ArithTask, draw_unique
from ..regime.copies import RECALL_VIEWS
from ..regime.study import probe_levels
from ..study import Study
from ..tiny import build_tokenizer, pretrain_tiny_llama
from .budgets import eval_s, stage_budgets, trace_s, train_s
from .protocol import STAGES, Protocol, select_level

TINY_PRETRAIN_STEPS = 60
"""Autoregressive steps that make the smoke run's tiny Llama a (crudely) pretrained model, as SmolLM2 is: a random
one, MDLM-trained for a few steps, predicts only EOS, so its evaluations decoded nothing and traced nothing."""


def converted(gguf: Path, folder: Path) -> None:
    """SmolLM2 from its GGUF saved as a plain float32 checkpoint (the dequantized weights, exactly): reading the
    GGUF takes ~35 s of CPU time (measured here), the checkpoint ~1 s, and the study loads the model three times."""
    model, tokenizer = load_teacher(str(gguf), device="cpu", dtype=torch.float32)
    drop_gguf_marks(model).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


class Replication(Study):
    """The study of a :class:`~.protocol.Protocol` in a folder: the library's stages with this study's data,
    pretrained model (SmolLM2 from ``gguf``, or the smoke run's tiny Llama), level selection and budgets;
    ``Replication(folder, protocol, gguf, device, deadline, results_dir)``."""

    protocol: Protocol
    stages = STAGES
    source = "recipes/smollm2"

    def __init__(self, output: Path, protocol: Protocol, gguf: Path | None, device: str,
                 deadline: float = float("inf"), results_dir: Path | None = None) -> None:
        super().__init__(output, protocol, device, deadline, results_dir)
        self.gguf = gguf

    @property
    def teacher_name(self) -> str:
        return "SmolLM2-135M-Instruct" if self.protocol.student == "smollm2" else "tiny Llama"

    def stage_data(self) -> None:
        """Train rows of every level (shuffled together) and held-out selection and test rows per level, every
        question once over all of them: the held-out rows of every level are drawn first, then train rows that are
        none of them (small levels repeat problems, and a level-1 problem can be drawn at level 2)."""
        folder, p = self.output / "data", self.protocol
        if not self.units.unit(folder, "data"):
            return
        started, train, taken = time.perf_counter(), [], set()
        streams = {level: random.Random(p.data_seed + level) for level in p.levels}
        for level in p.levels:
            held_out = draw_unique(streams[level], level, p.selection_per_level + p.test_problems, taken,
                                   p.chain_steps)
            write_json_rows(folder / f"selection-L{level}.jsonl", held_out[: p.selection_per_level])
            write_json_rows(folder / f"test-L{level}.jsonl", held_out[p.selection_per_level :])
        for level in p.levels:
            train += draw_unique(streams[level], level, p.train_per_level, taken, p.chain_steps)
        random.Random(p.data_seed).shuffle(train)
        write_json_rows(folder / "train.jsonl", as_prompt_completion(Dataset.from_list(train), "question", "answer"))
        self.units.done(folder, "data", started, {"train_rows": len(train)})

    def stage_pretrained(self) -> None:
        """SmolLM2 from its GGUF as a plain checkpoint, or the smoke run's stand-in: the demo's tokenizer over the
        data and a tiny Llama pretrained for :data:`TINY_PRETRAIN_STEPS` next-token steps (under a second)."""
        folder, p = self.output / "pretrained", self.protocol
        if not self.units.unit(folder, "pretrained"):
            return
        started = time.perf_counter()
        if p.student == "smollm2":
            converted(self.gguf, folder)
        else:
            tokenizer = build_tokenizer(row["prompt"] + "\n" + row["completion"] for row in self.training_rows())
            pretrain_tiny_llama(folder, tokenizer, self.training_rows(), (32, 2, 2), p.student_format.max_length,
                                TINY_PRETRAIN_STEPS, 3e-3, p.batch_size, p.data_seed, self.output / "work" / "pretrained")
        self.units.done(folder, "pretrained", started)

    def stage_select(self) -> None:
        """The base's accuracy per level on the selection rows at ``selection_threshold`` decides the level."""
        folder, p = self.output / "select", self.protocol
        if not self.units.unit(folder, "select"):
            return
        started = time.perf_counter()
        accuracies, copies = {}, {}
        for level, (result, recall) in probe_levels(self, folder, "arith").items():
            accuracies[level], copies[level] = result.accuracy, recall
            print(f"level {level}: base accuracy {result.accuracy:.3f} (n={result.num_samples}); results right with the "
                  f"rest visible / later numbers masked / left to right: "
                  f"{' / '.join(f'{copies[level][view]:.2f}' for view in RECALL_VIEWS)}", flush=True)
        level, met = select_level(accuracies, p.target_accuracy)
        print(f"selected level {level} ({'meets' if met else 'MISSES'} the {p.target_accuracy:.0%} target)", flush=True)
        self.units.done(folder, "select", started, {"accuracies": accuracies, "level": level, "meets_target": met,
                                                   "copies": copies})

    def selected_level(self) -> int:
        return int(json.loads((self.output / "select" / "unit.json").read_text())["level"])

    def test_task(self) -> Any:
        level = self.selected_level()
        return ArithTask(read_json_rows(self.output / "data" / f"test-L{level}.jsonl"), name=f"arith-L{level}")

    def eval_tag(self) -> str:
        return f" L{self.selected_level()}"

    def prior_s(self, kind: str, steps: int = 0) -> float:
        """The budget from counts on a GPU; nothing on a CPU (the smoke run takes seconds)."""
        if self.device != "cuda":
            return 0.0
        if kind == "train":
            return train_s(self.protocol, steps)
        return eval_s(self.protocol, self.protocol.test_problems) + (trace_s(self.protocol) if kind == "traced" else 0)

    def before_base_training(self, model: Any) -> dict[str, Any]:
        """Protocol 2: the base turns bidirectional over its first ``anneal_steps`` (DiffuLLaMA's annealing)."""
        if not self.protocol.anneal_steps:
            return {}
        from trims_hf.studies.annealing import AttentionAnnealing

        AttentionAnnealing(model, self.protocol.anneal_steps, seed=self.protocol.seed)
        return {"attention_anneal_steps": self.protocol.anneal_steps}

    def report_extra(self) -> dict[str, Any]:
        return {"selection": json.loads((self.output / "select" / "unit.json").read_text()),
                "budget_s": {unit: round(seconds, 1) for unit, seconds, _ in stage_budgets(self.protocol)}}
