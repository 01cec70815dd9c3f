"""trims_hf: TRIMS (Trajectory-Ranked Instruction Masked Supervision) on the Hugging Face stack."""

__version__ = "0.1.0"

from .students import StudentSpec, load_student, mask_token_id, prepare_student, student_logits, student_spec
from .buckets import equal_mass_buckets, project_buckets, project_scores
from .collator import TrimsDataCollator
from .config import MDLMConfig
from .masking import noise_batch
from .preparation import StudentFormat, prepare_dataset
from .schema import SchemaError
from .trainer import MDLMTrainer
from .lora import lora_config
from .metrics import available_metrics, metric_path
from .tasks import (
    BOXED_INSTRUCTION,
    CodeExecutionDisabled,
    CodeTask,
    Example,
    Grade,
    GSM8KTask,
    HumanEvalTask,
    Math500Task,
    MBPPTask,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    Task,
    TaskDataError,
    bubblewrap_command,
    bubblewrap_problem,
    get_task,
    registry,
    run_program,
    run_tests,
)
from .generation import (
    ConfidenceFactor,
    ConfidenceThreshold,
    DecodingConfig,
    EntropyThreshold,
    FixedSteps,
    GenerationOutput,
    TokensPerStepRecorder,
    TrajectoryRecorder,
    generate,
    generate_text,
    teacher_nll_per_step,
)
from .hub import HubAccessError, check_push_access, load_source_dataset, read_card_metadata, save_dataset_folder, scored_dataset_card
from .scoring import (
    DEFAULT_TEACHER,
    ScoringOptions,
    add_teacher_buckets,
    build_scored_dataset,
    load_teacher,
    score_dataset,
    token_scores,
)
from .evaluation import EvalResult, SampleRecord, evaluate_task, format_table, plot_frontier, sweep
from .callbacks import DecodeEvalCallback
from .model_card import trims_model_card
from .training import DataArguments, ModelArguments, RecipeError, parse_recipe, train
