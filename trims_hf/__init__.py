"""trims_hf: TRIMS (Trajectory-Ranked Instruction Masked Supervision) on the Hugging Face stack.

The public API is re-exported here and imported lazily (on first attribute access), so that
``import trims_hf`` and ``trims --help`` do not pay for torch, transformers and datasets.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# submodule -> the public names it defines: what a user imports. Analysis, report writers and the commands' own
# plumbing (pre-flight checks, cards, recipe parsing) stay in their modules (e.g. ``trims_hf.analysis``).
_EXPORTS: dict[str, tuple[str, ...]] = {
    "settings": ("DEFAULT_TEACHER", "BucketConfig", "DecodingConfig", "MaskingConfig", "PromptFormat", "ScoringOptions",
                 "StudentFormat"),
    "prompts": ("prompt_token_ids", "render_prompt"),
    "students": ("AdapterError", "MaskTokenError", "StudentKindError", "StudentSpec", "add_mask_token", "detect_student_kind",
                 "load_adapter", "load_student", "mask_token_id", "prepare_student", "student_logits", "student_mask_token_id",
                 "student_spec"),
    "buckets": ("bucket_rows", "equal_mass_buckets", "project_scores", "teacher_coverage", "threshold_buckets"),
    "collator": ("TrimsDataCollator",),
    "config": ("MDLMConfig",),
    "masking": ("noise_batch",),
    "block_diffusion": ("block_diffusion_inputs", "block_diffusion_mask"),
    "loss": ("mdlm_loss", "per_sample_loss"),
    "preparation": ("prepare_dataset",),
    "schema": ("SchemaError",),
    "trainer": ("CollatorEpochCallback", "MDLMTrainer"),
    "lora": ("lora_config",),
    "metrics": ("available_metrics", "metric_path"),
    "tasks": (
        "ArithTask", "BOXED_INSTRUCTION", "CodeExecutionDisabled", "CodeTask", "Example", "Grade", "GSM8KTask", "HumanEvalTask",
        "Math500Task", "MBPPTask", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "Task", "TaskDataError",
        "get_task", "registry",
        "run_program", "run_tests",
    ),
    "generation": (
        "ConfidenceFactor", "ConfidenceThreshold", "EntropyThreshold", "FixedSteps", "GenerationOutput", "ThresholdQuota",
        "TokensPerStepRecorder", "TrajectoryRecorder", "generate", "generate_text", "teacher_nll_per_step",
    ),
    "hub": ("HubAccessError", "load_source_dataset"),
    "teacher": ("load_teacher", "load_teacher_tokenizer"),
    "errors": ("InputError",),
    "sources": ("SourceError",),
    "jobs.score": ("ScoringInterrupted", "build_scored_dataset"),
    "evaluation": ("EvalResult", "EvaluationInterrupted", "SampleRecord", "evaluate_task", "sweep"),
    "reports": ("library_versions",),
    "callbacks": ("DecodeEvalCallback",),
    "export": ("export", "export_adapter", "export_merged"),
    "model_config": ("ModelConfig", "ResolvedStudent", "load_model", "resolve_student"),
}
_OWNER = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_OWNER)


def __getattr__(name: str) -> Any:
    if name not in _OWNER:
        raise AttributeError(f"module 'trims_hf' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_OWNER[name]}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

