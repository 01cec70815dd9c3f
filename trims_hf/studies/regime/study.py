"""The regime study itself: :class:`RegimeStudy`, the library's study runner on the arithmetic chain problems with a
tiny causal Llama trained here as the pretrained model and teacher, and its ``probe`` stage (the base alone on each
level's held-out selection problems). Importing it loads torch; the curve and the seed study import it when they run."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from ...data.schema import as_prompt_completion
from ...evaluation.tasks.base import read_json_rows, write_json_rows
from ..arith import ArithTask, draw_unique
from ..protocol import BASE
from ..study import Study
from .copies import COPIES_ROWS, result_recall
from .protocol import RegimeProtocol
from .records import answer_tokens, unit_record


class RegimeStudy(Study):
    """The library's :class:`~trims_hf.studies.study.Study` on the chain problems of :class:`RegimeProtocol`, with a
    ``probe`` stage before the variants; ``RegimeStudy(folder, protocol, "cpu", deadline)``."""

    protocol: RegimeProtocol
    stages = ("data", "pretrained", "score", "base", "probe", "models", "report")
    source = "trims_hf.studies.regime"
    teacher_name = "the pretrained tiny Llama"

    def stage_data(self) -> None:
        """Held-out selection and test rows per level, then train rows of every level shuffled together; every
        question appears once over all of them. The tokenizer is built over all texts."""
        from datasets import Dataset

        from ..tiny import build_tokenizer

        folder, p = self.output / "data", self.protocol
        if not self.units.unit(folder, "data", "data"):
            return
        started, train, taken = time.perf_counter(), [], set()
        streams = {level: random.Random(p.data_seed + level) for level in p.levels}
        texts = []
        for level in p.levels:
            held_out = draw_unique(streams[level], level, p.selection_per_level + p.test_problems, taken,
                                   p.chain_steps)
            write_json_rows(folder / f"selection-L{level}.jsonl", held_out[: p.selection_per_level])
            write_json_rows(folder / f"test-L{level}.jsonl", held_out[p.selection_per_level :])
            texts += held_out
        for level in p.levels:
            train += draw_unique(streams[level], level, p.train_per_level, taken, p.chain_steps)
        random.Random(p.data_seed).shuffle(train)
        write_json_rows(folder / "train.jsonl", as_prompt_completion(Dataset.from_list(train), "question", "answer"))
        build_tokenizer(r["question"] + "\n" + r["answer"] for r in texts + train).save_pretrained(folder / "tokenizer")
        self.units.done(folder, "data", started, {"train_rows": len(train)}, stage="data")

    def stage_pretrained(self) -> None:
        """The tiny causal Llama trained autoregressively on the training rows: the student's start, the teacher."""
        self.pretrain_tiny(self.protocol.pretrain_steps, self.protocol.pretrain_lr, self.protocol.pretrain_batch_size)

    def stage_probe(self) -> None:
        """The base alone on each level's selection problems at ``selection_threshold``: accuracy, generated tokens
        per answer and tokens per step (what the regime rule reads), before any variant."""
        folder = self.output / "probe"
        if not self.units.unit(folder, "probe", "probe"):
            return
        started = time.perf_counter()
        levels = {}
        for level, (result, copies) in probe_levels(self, folder, "chain").items():
            levels[level] = {"accuracy": result.accuracy, "answer_tokens": answer_tokens(result),
                             "tokens_per_step": result.tokens_per_step, "problems": result.num_samples,
                             "copies": copies}
            print(f"level {level}: base accuracy {result.accuracy:.3f}, {levels[level]['answer_tokens']:.1f} "
                  f"tokens per answer (n={result.num_samples})", flush=True)
        self.units.done(folder, "probe", started, {"levels": levels}, stage="probe")

    def before_base_training(self, model: Any) -> dict[str, Any]:
        if not self.protocol.anneal_steps:
            return {}
        from ..annealing import AttentionAnnealing

        AttentionAnnealing(model, self.protocol.anneal_steps, seed=self.protocol.seed)
        return {"attention_anneal_steps": self.protocol.anneal_steps}

    def test_task(self) -> Any:
        level = self.protocol.test_level
        return ArithTask(read_json_rows(self.output / "data" / f"test-L{level}.jsonl"), name=f"chain-L{level}")

    def eval_tag(self) -> str:
        return f" L{self.protocol.test_level}"

    def report_extra(self) -> dict[str, Any]:
        return {"probe": unit_record(self.output, "probe")}


def probe_levels(study: Any, folder: Path, task: str) -> dict[int, tuple[Any, dict[str, Any]]]:
    """The study's base alone on each level's selection problems (``data/selection-L<level>.jsonl``), before any
    variant: its evaluation at ``selection_threshold`` (saved as ``folder/L<level>.json``) and its
    :func:`result_recall` on the first :data:`COPIES_ROWS` of them; what the regime's probe and SmolLM2's level
    selection read."""
    from ...evaluation.evaluate import evaluate_task
    from ...evaluation.results import save_results
    from ...evaluation.tasks.base import read_json_rows
    from ..arith import ArithTask
    from ..study import on_device

    p, tokenizer = study.protocol, study.tokenizer()
    model = on_device(study.load_student(study.output / "base"), study.device)
    probed = {}
    for level in p.levels:
        rows = read_json_rows(study.output / "data" / f"selection-L{level}.jsonl")
        result = evaluate_task(model, tokenizer, ArithTask(rows, name=f"{task}-L{level} selection"),
                               p.decoding_at(p.selection_threshold), batch_size=p.eval_batch_size, model_name=BASE)
        save_results([result], folder / f"L{level}.json")
        probed[level] = result, result_recall(model, tokenizer, rows[:COPIES_ROWS], p.student_format)
    return probed
