"""The regime study's protocol: the chain task, the tiny student's size, the pretrained model's and the base's
training, the regime rule's pre-registered targets, and the fields each stage's key reads. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ...settings import DecodingConfig, StudentFormat
from ..protocol import BUCKET_FIELDS, MDLM_MASKING_FIELDS, LeveledOneSeedProtocol, StudyProtocol

DATA_FIELDS = ("levels", "chain_steps", "train_per_level", "selection_per_level", "test_problems", "data_seed")
PRETRAINED_FIELDS = (*DATA_FIELDS, "student_format", "hidden_size", "num_layers", "num_heads", "pretrain_steps",
                     "pretrain_lr", "pretrain_batch_size", "threads")
SCORE_FIELDS = (*PRETRAINED_FIELDS, *BUCKET_FIELDS)
BASE_FIELDS = (*PRETRAINED_FIELDS, *MDLM_MASKING_FIELDS, "base_steps", "base_lr", "batch_size", "anneal_steps", "seed")
PROBE_FIELDS = (*BASE_FIELDS, "decoding", "selection_threshold", "eval_batch_size")


@dataclass(frozen=True)
class RegimeProtocol(LeveledOneSeedProtocol):
    """The regime study's protocol: the task (chain problems at several levels), the tiny student's size, the
    pretrained model's and the base's training, and the pre-registered targets of the regime rule."""

    student_format: StudentFormat = field(default_factory=lambda: StudentFormat(max_length=160))
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(gen_length=96, block_length=32,
                                                                            cache="dual"))
    """Fast-dLLM threshold decoder, dual cache, early stop; 96 tokens hold the longest level-2 answers (~70)."""
    levels: tuple[int, ...] = (1, 2)
    """Difficulty levels (:func:`~trims_hf.studies.arith.level_scale`: level 2 draws 4x larger numbers); the training
    rows mix them, and each has its own held-out selection and test problems."""
    chain_steps: int = 3
    """Steps of a chain problem: 3 give answers of ~55 tokens at level 1."""
    train_per_level: int = 2000
    selection_per_level: int = 200
    """Held-out problems per level on which the base alone is measured (the probe)."""
    test_problems: int = 500
    """Held-out problems of :attr:`test_level` every model of the study is evaluated on."""
    data_seed: int = 0
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    pretrain_steps: int = 400
    """Autoregressive steps of the tiny Llama that is the pretrained model (the student's start) and the teacher."""
    pretrain_lr: float = 1e-3
    pretrain_batch_size: int = 32
    batch_size: int = 16
    base_steps: int = 1000
    base_lr: float = 1e-3
    anneal_steps: int = 0
    """The base's first steps over which its attention turns from causal to bidirectional (DiffuLLaMA's annealing,
    :class:`~trims_hf.studies.annealing.AttentionAnnealing`); 0: bidirectional from the first step."""
    variant_steps: int = 250
    variant_lr: float = 3e-4
    eval_batch_size: int = 500
    trace_samples: int = 16
    seed: int = 0
    """The base's and its variants' training seed: one base per seed."""
    test_level: int = 1
    """The level the study's models are evaluated on (the curve's choice)."""
    selection_threshold: float = 0.9
    target_accuracy: float = 0.6
    """The regime rule: the base reaches this on a level's selection problems at :attr:`selection_threshold`..."""
    min_answer_tokens: float = 48.0
    """... its answers there are at least this many generated tokens on average ..."""
    min_hard_share: float = 0.5
    """... and the hardest 1/K of the training completion tokens (teacher NLL) hold at least this share of the
    teacher's NLL: a few hard tokens among mostly predictable ones."""
    threads: int = 1
    """torch CPU threads (they decide float results); 1 because two threads on two shared cores ran 6x slower."""

    EVALUATE_BASE = False
    """The probe measures the base (on the selection problems) before any variant; the study's evaluations are the
    four models' only."""
    STAGE_FIELDS = {"data": DATA_FIELDS, "pretrained": PRETRAINED_FIELDS, "score": SCORE_FIELDS, "base": BASE_FIELDS,
                    "probe": PROBE_FIELDS}

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = (
        "chain_steps", "train_per_level", "selection_per_level", "test_problems", "hidden_size", "num_layers",
        "num_heads", "pretrain_steps", "pretrain_batch_size", "threads", *StudyProtocol.POSITIVE_FIELDS)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.test_level not in self.levels:
            raise ValueError(f"test_level={self.test_level}: must be one of levels {self.levels}.")

    def parameters(self) -> int:
        """The tiny Llama's parameters without its (tied) embedding: what a training token's cost scales with."""
        h = self.hidden_size
        return self.num_layers * (4 * h * h + 3 * h * 3 * h)

    def cost(self) -> float:
        """The training cost of the base and its pretrained model, the curve's order: rows seen x parameters (FLOPs up
        to a constant)."""
        rows = self.base_steps * self.batch_size + self.pretrain_steps * self.pretrain_batch_size
        return float(rows * self.parameters())
