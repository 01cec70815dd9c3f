"""trims_hf: TRIMS (Trajectory-Ranked Instruction Masked Supervision) on the Hugging Face stack.

The public API is re-exported here and imported lazily (on first attribute access), so that
``import trims_hf`` and ``trims --help`` do not pay for torch, transformers and datasets.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# submodule -> the public names it defines: what a user imports, stage by stage (core, scoring and data, students,
# training, generation, evaluation, export; then the one name of the studies' wing, ``ArithTask``, mapped by name only:
# no plugin module imports the studies). Analysis, report writers and the commands' own plumbing (pre-flight checks,
# cards, recipe parsing) stay in their modules (e.g. ``trims_hf.studies.analysis``).
_EXPORTS: dict[str, tuple[str, ...]] = {
    "settings": ("DEFAULT_TEACHER", "BucketConfig", "DecodingConfig", "MaskingConfig", "PromptFormat", "ScoringOptions",
                 "StudentFormat"),
    "prompts": ("prompt_token_ids", "render_prompt"),
    "errors": ("InputError",),
    "sources": ("SourceError",),
    "reports": ("library_versions",),
    "data.buckets": ("bucket_rows", "equal_mass_buckets", "project_scores", "teacher_coverage", "threshold_buckets"),
    "data.preparation": ("prepare_dataset",),
    "data.schema": ("SchemaError",),
    "data.hub": ("HubAccessError", "load_source_dataset"),
    "data.teacher": ("load_teacher", "load_teacher_tokenizer"),
    "data.score_job": ("ScoringInterrupted", "build_scored_dataset"),
    "students": ("AdapterError", "MaskTokenError", "StudentKindError", "StudentSpec", "add_mask_token", "detect_student_kind",
                 "get_lora_model", "load_adapter", "load_student", "load_student_tokenizer", "mask_token_id",
                 "prepare_student", "student_logits", "student_mask_token_id", "student_spec"),
    "students.block_diffusion": ("block_diffusion_inputs", "block_diffusion_mask"),
    "students.loss": ("mdlm_loss", "per_sample_loss"),
    "model_config": ("ModelConfig", "ResolvedStudent", "load_model", "resolve_student"),
    "training.collator": ("TrimsDataCollator",),
    "training.config": ("MDLMConfig",),
    "training.masking": ("noise_batch",),
    "training.trainer": ("CollatorEpochCallback", "MDLMTrainer"),
    "training.lora": ("lora_config",),
    "training.callbacks": ("DecodeEvalCallback",),
    "generation": (
        "ConfidenceFactor", "ConfidenceThreshold", "EntropyThreshold", "FixedSteps", "GenerationOutput", "ThresholdQuota",
        "TokensPerStepRecorder", "TrajectoryRecorder", "generate", "generate_text", "teacher_nll_per_step",
    ),
    "evaluation.metrics": ("available_metrics", "metric_path"),
    "evaluation.tasks": (
        "BOXED_INSTRUCTION", "CodeExecutionDisabled", "CodeTask", "Example", "Grade", "GSM8KTask", "HumanEvalTask",
        "Math500Task", "MBPPTask", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "Task", "TaskDataError",
        "get_task", "registry",
        "run_program", "run_tests",
    ),
    "evaluation.evaluate": ("EvalResult", "EvaluationInterrupted", "SampleRecord", "evaluate_task", "sweep"),
    "exporting": ("export", "export_adapter", "export_merged"),
    "studies.arith": ("ArithTask",),
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

