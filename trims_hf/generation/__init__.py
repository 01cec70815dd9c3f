"""Parallel decoding of masked-diffusion students, its KV caches, hooks and plots."""

from .cache import BlockKVCache, StudentForward
from .decoding import (
    ConfidenceFactor,
    ConfidenceThreshold,
    DecodingConfig,
    EntropyThreshold,
    FixedSteps,
    GenerationOutput,
    Strategy,
    generate,
    generate_text,
)
from .hooks import (
    DecodeHook,
    GenerationStart,
    StepRecord,
    TokensPerStepRecorder,
    Trajectory,
    TrajectoryRecorder,
    non_eos_tokens,
    teacher_nll_per_step,
    tokens_before_stop,
)

__all__ = [
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
    "TokensPerStepRecorder",
    "Trajectory",
    "TrajectoryRecorder",
    "generate",
    "generate_text",
    "non_eos_tokens",
    "teacher_nll_per_step",
    "tokens_before_stop",
]
