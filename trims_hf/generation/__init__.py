"""Parallel decoding of masked-diffusion students: the decoders (:mod:`.decoding`, :mod:`.block_causal`), the steps
they share (:mod:`.steps`), KV caches (:mod:`.cache`), hooks and recorders (:mod:`.hooks`) and plots (:mod:`.plots`)."""

from ..settings import DecodingConfig
from .block_causal import BlockForward
from .cache import BlockKVCache, StudentForward
from .decoding import generate, generate_text
from .hooks import (
    DecodeHook,
    GenerationStart,
    StepRecord,
    TokensPerStepRecorder,
    Trajectory,
    TrajectoryRecorder,
    answer_text,
    cut_at_stop_strings,
    non_eos_tokens,
    teacher_nll_per_step,
    throughput,
    tokens_covering,
)
from .steps import (
    ConfidenceFactor,
    ConfidenceThreshold,
    EntropyThreshold,
    FixedSteps,
    GenerationOutput,
    Strategy,
    ThresholdQuota,
    tokens_before_stop,
)

__all__ = [
    "BlockForward",
    "BlockKVCache",
    "ConfidenceFactor",
    "ConfidenceThreshold",
    "DecodeHook",
    "DecodingConfig",
    "EntropyThreshold",
    "FixedSteps",
    "GenerationOutput",
    "GenerationStart",
    "StepRecord",
    "Strategy",
    "StudentForward",
    "ThresholdQuota",
    "TokensPerStepRecorder",
    "Trajectory",
    "TrajectoryRecorder",
    "answer_text",
    "cut_at_stop_strings",
    "generate",
    "generate_text",
    "non_eos_tokens",
    "teacher_nll_per_step",
    "throughput",
    "tokens_before_stop",
    "tokens_covering",
]
