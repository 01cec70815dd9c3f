"""Every setting of trims_hf, declared once: dataclasses with help strings and the paper's defaults.

The same classes configure the Python API, the ``trims`` commands (parsed with ``HfArgumentParser``)
and the YAML recipes, so a flag, a recipe key and a keyword argument are one declaration. This module
imports neither torch nor transformers, so ``trims ... --help`` stays fast.

* :class:`PromptFormat` / :class:`ResponseFormat` / :class:`StudentFormat`: how a prompt (and completion) becomes
  tokens, and which tokens end a response.
* :class:`ScoringOptions`: how the teacher scores rows (paper §3.1).
* :class:`BucketConfig`: how teacher scores are cut into K equal-mass buckets (paper §3.2).
* :class:`MaskingConfig`: the forward (noising) process of MDLM and TRIMS (paper Algorithm 1).
* :class:`DecodingConfig`: the parallel decoder (Fast-dLLM threshold by default).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any, ClassVar, Literal, TypeVar, get_args

Ordering = Literal["hard_to_easy", "easy_to_hard", "random"]
Metric = Literal["nll", "entropy"]
QuantileTokens = Literal["kept", "all"]
PaddingSide = Literal["right", "left"]
TrajectorySelection = Literal["per_draw", "fixed_subset"]
TrajectoryLossWeight = Literal["elbo", "inverse_mask_ratio", "none"]
NoiseScheduleName = Literal["linear", "cosine"]
Padding = Literal["longest", "max_length"]
StrategyName = Literal["threshold", "fixed_steps", "entropy", "factor", "threshold_quota"]
CacheMode = Literal["none", "prefix", "dual"]
StepMode = Literal["auto", "eager", "static", "graph"]

MAX_BUCKETS = 127  # bucket ids are stored as int8
DEFAULT_TEACHER = "Qwen/Qwen3-8B"  # the paper's teacher
PROMPT_FORMATS = ("chat_template", "plain", "verbatim")
SEQUENCE_LENGTH = 1024  # the paper's training sequence length (§4)


def settings_record(value: Any) -> Any:
    """``dataclasses.asdict`` of a setting (nested settings included), less the fields its class names in
    ``RECORDED_WHEN_SET`` while they hold their default: what a record or a fingerprint holds. A setting added after
    records of its class existed is named there, so that every record written before it (a protocol's fingerprint,
    an evaluation's run fingerprint) keeps its key; set, it is recorded as any other."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        later = getattr(type(value), "RECORDED_WHEN_SET", ())
        return {f.name: settings_record(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not (f.name in later and getattr(value, f.name) == f.default)}
    if isinstance(value, (list, tuple)):
        return type(value)(settings_record(item) for item in value)
    if isinstance(value, dict):
        return {key: settings_record(item) for key, item in value.items()}
    return value


def check_choice(name: str, value: Any, kind: Any) -> None:
    if value not in get_args(kind):
        raise ValueError(f"{name}={value!r}; choose one of {', '.join(get_args(kind))}.")


SEED_RANGE = (0, 2**32 - 1)
"""The seeds every generator the library seeds takes (numpy's and transformers' ``set_seed``: 32-bit, unsigned)."""


def check_seed(name: str, value: int | None) -> None:
    """One-line ``ValueError`` for a seed numpy would refuse later, after work was done."""
    if value is not None and not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise ValueError(f"{name}={value}: must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}].")


_FIELD_KINDS = {"int": (Integral, "a whole number (int)"), "float": (Real, "a number"),
                "bool": (bool, "true or false (a bool)")}


def check_field_types(settings: Any, cls: type) -> None:
    """Each ``int``, ``float`` and ``bool`` field that ``cls`` itself declares holds a value of that kind (a bool is no
    number here, and a number or string no bool): a string or a fraction given in Python (``num_buckets=2.5``,
    ``"8"``, ``compile_blocks="no"``) would otherwise pass or fail far from the setting, in a comparison, a shape or a
    truth test. Called first in each class's ``__post_init__``, before the ranges."""
    for name, hint in cls.__annotations__.items():
        kind, optional = hint.removesuffix(" | None"), hint.endswith(" | None")
        value = getattr(settings, name)
        if kind not in _FIELD_KINDS or (optional and value is None):
            continue
        types, what = _FIELD_KINDS[kind]
        if not isinstance(value, types) or (kind != "bool" and isinstance(value, bool)):
            raise TypeError(f"{name}={value!r}: must be {what}, not {type(value).__name__}.")


def response_tokens(end_of_response: str | Sequence[str] | None) -> list[str] | None:
    """``end_of_response`` as a list of tokens: one string is one token (``"<eos>"``), never its characters, as the
    YAML and command-line spellings of a single token already read it."""
    if end_of_response is None:
        return None
    tokens = [end_of_response] if isinstance(end_of_response, str) else list(end_of_response)
    if not all(isinstance(token, str) and token for token in tokens):
        raise TypeError(f"end_of_response={end_of_response!r}: must be a token or a list of tokens (non-empty strings).")
    return tokens


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise ValueError(f"{name}={value}: must be in [0, 1].")


def _check_non_negative(name: str, value: float) -> None:
    if not 0.0 <= value < math.inf:  # NaN fails too
        raise ValueError(f"{name}={value}: must be a finite number >= 0.")


@dataclass
class PromptFormat:
    """How a prompt is rendered and tokenised, the same way for the teacher, training, decoding and evaluation."""

    prompt_format: str = field(
        default="chat_template",
        metadata={"help": "chat_template: the tokenizer's chat template (user turn + generation prompt; plain when the "
                  "tokenizer has none); plain: the prompt text (chat messages joined by a blank line) with the "
                  "tokenizer's special tokens; verbatim: text already rendered (e.g. by lm-evaluation-harness), "
                  "no special tokens added; or a format string containing {prompt}."},
    )
    system_prompt: str | None = field(
        default=None, metadata={"help": "Optional system message placed before the prompt (chat template only)."}
    )

    def __post_init__(self) -> None:
        """The format is known, and a system prompt goes with the one format that renders it: the others would drop
        it silently while every record still names it."""
        if not isinstance(self.prompt_format, str) or (self.prompt_format not in PROMPT_FORMATS
                                                       and "{prompt}" not in self.prompt_format):
            raise ValueError(f"prompt_format must be one of {', '.join(PROMPT_FORMATS)} or contain '{{prompt}}', "
                             f"got {self.prompt_format!r}.")
        if self.system_prompt is not None and self.prompt_format != "chat_template":
            raise ValueError(f"system_prompt goes into the chat template, and prompt_format={self.prompt_format!r} "
                             "renders none; drop system_prompt, or use prompt_format='chat_template'.")


@dataclass
class ResponseFormat(PromptFormat):
    """How a student's prompt is rendered and where its response ends: what training and decoding must agree on."""

    end_of_response: list[str] | None = field(
        default=None,
        metadata={"help": "Tokens training appends after each completion and decoding stops at; default: the token the "
                  "tokenizer's chat template ends an assistant turn with, then its EOS (LLaDA: <|eot_id|> "
                  "<|endoftext|>; Dream: <|im_end|> <|endoftext|>)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.end_of_response = response_tokens(self.end_of_response)


@dataclass
class StudentFormat(ResponseFormat):
    """How a scored row becomes student tokens: the prompt format, the end of the response and the length cap."""

    max_length: int = field(
        default=SEQUENCE_LENGTH, metadata={"help": "Maximum student sequence length; the completion is cut, the prompt never is."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_field_types(self, StudentFormat)
        if self.max_length < 2:
            raise ValueError(f"max_length must be at least 2, got {self.max_length}.")


@dataclass
class ScoringOptions(PromptFormat):
    """How rows are formatted for the teacher (the shared :class:`PromptFormat`), cut and batched."""

    teacher_max_length: int | None = field(
        default=None, metadata={"help": "The teacher's context in tokens (prompt and completion); default: "
                                "max_position_embeddings of the teacher config.", "old_flags": ("--max-length", "--max_length")}
    )
    truncate: bool = field(
        default=False, metadata={"help": "Score only the completion prefix that fits the context (recorded in the card)."}
    )
    max_tokens_per_batch: int = field(
        default=8192, metadata={"help": "Padded tokens per forward (rows x longest row); a longer row gets a batch of its own."}
    )
    train_max_length: int = field(
        default=SEQUENCE_LENGTH,
        metadata={"help": "Sequence length training cuts rows to, counted in teacher tokens (prompt included): with "
                  "quantile_tokens=kept the teacher-side buckets (teacher_bucket, the card's thresholds) are cut over "
                  "the completion tokens within it. Students recompute buckets over their own tokens."},
    )
    rows_per_work_chunk: int = field(
        default=256, metadata={"help": "Most rows per resumable unit of work (one saved file each)."}
    )
    min_work_chunks: int = field(
        default=16, metadata={"help": "Fewest work chunks a run is cut into (fewer only with fewer rows), so small runs "
                              "keep their progress too."}
    )
    logits_chunk_elements: int = field(
        default=2**24, metadata={"help": "Logits computed at once (positions x vocab); bounds the scorer's extra memory."}
    )
    padding_side: PaddingSide = field(
        default="right", metadata={"help": "Padding side of teacher batches (scores do not depend on it)."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_field_types(self, ScoringOptions)
        if self.teacher_max_length is not None and self.teacher_max_length < 2:
            raise ValueError(f"teacher_max_length={self.teacher_max_length}: must be at least 2 (one prompt and one "
                             "completion token).")
        for name in ("train_max_length", "max_tokens_per_batch", "rows_per_work_chunk", "min_work_chunks",
                     "logits_chunk_elements"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be at least 1.")
        check_choice("padding_side", self.padding_side, PaddingSide)

    def rows_per_chunk(self, num_rows: int) -> int:
        """Rows per work chunk for a run of ``num_rows``: at most ``rows_per_work_chunk``, and small enough for at
        least ``min_work_chunks`` chunks, so an interrupted small run keeps most of its work."""
        return max(1, min(self.rows_per_work_chunk, -(-num_rows // self.min_work_chunks)))


@dataclass
class BucketConfig:
    """How per-token teacher scores are cut into K equal-mass difficulty buckets (paper §3.2: K = 8, hardest first)."""

    num_buckets: int = field(default=8, metadata={"help": "K, the number of equal-mass difficulty buckets."})
    bucket_ordering: Ordering = field(
        default="hard_to_easy",
        metadata={"help": "Which tokens bucket 0 (revealed first) holds: hard_to_easy (paper), easy_to_hard, or random."},
    )
    metric: Metric = field(default="nll", metadata={"help": "Teacher score the buckets are cut on: nll (paper) or entropy."})
    bucket_seed: int = field(default=0, metadata={"help": "Seed of the random ordering."})
    quantile_tokens: QuantileTokens = field(
        default="kept",
        metadata={"help": "Tokens the equal-mass quantiles are cut over: kept (the completion tokens that survive "
                  "truncation to the training length, the tokens training sees) or all (whole completions). Tokens "
                  "without a teacher score never enter the quantiles."},
    )

    def __post_init__(self) -> None:
        check_field_types(self, BucketConfig)
        if not 1 <= self.num_buckets <= MAX_BUCKETS:
            raise ValueError(f"num_buckets must be in [1, {MAX_BUCKETS}], got {self.num_buckets}.")
        check_choice("bucket_ordering", self.bucket_ordering, Ordering)
        check_seed("bucket_seed", self.bucket_seed)
        check_choice("metric", self.metric, Metric)
        check_choice("quantile_tokens", self.quantile_tokens, QuantileTokens)

    @property
    def end_bucket(self) -> int:
        """Bucket of end-of-response tokens and EOS padding: the last one, revealed last, under every ordering.

        They are not teacher-scored, so the orderings then differ only in the scored tokens; and a trajectory
        sample keeps the end of the response hidden until its last stage, as block-wise decoding reaches it last.
        """
        return self.num_buckets - 1


@dataclass
class MaskingConfig(BucketConfig):
    """The forward process: standard MDLM masking, and TRIMS trajectory masking for a share of samples.

    Defaults are the paper's (§4): ratio 0.1, p_context 0.05, p_future 0.95, linear schedule.

    A trajectory sample shows its context (the buckets revealed so far) and hides its future, so ``p_context`` may not
    exceed ``p_future`` and ``p_future`` is above 0 (docs/decisions.md). They may be equal: the sample then masks every
    response token at that one rate whatever its bucket, the control that removes the ordering from the objective.
    """

    p_context: float = field(
        default=0.05, metadata={"help": "Mask probability of context tokens (bucket <= k) in trajectory samples."}
    )
    p_future: float = field(
        default=0.95, metadata={"help": "Mask probability of future tokens (bucket > k) in trajectory samples."}
    )
    trajectory_ratio: float = field(
        default=0.1, metadata={"help": "Share of samples with trajectory masking; 0 trains the plain MDLM baseline."}
    )
    trajectory_selection: TrajectorySelection = field(
        default="per_draw",
        metadata={"help": "per_draw: each sample w.p. ratio at every draw; fixed_subset: a fixed ~ratio subset of examples."},
    )
    trajectory_loss_weight: TrajectoryLossWeight = field(
        default="elbo",
        metadata={"help": "Weight of trajectory samples: elbo (the sampled t's 1/t, Algorithm 1), inverse_mask_ratio or none."},
    )
    noise_schedule: NoiseScheduleName = field(default="linear", metadata={"help": "alpha_t schedule: linear (1 - t) or cosine."})
    min_t: float = field(default=1e-3, metadata={"help": "t is drawn from U(min_t, 1) so that the 1/t weight stays finite."})
    train_on_padding: bool = field(
        default=True, metadata={"help": "Attend to, mask and train on EOS padding (LLaDA convention)."}
    )
    padding: Padding = field(
        default="longest",
        metadata={"help": "Batch width: longest (each batch's longest row, as the dLLM code base; with train_on_padding "
                  "the EOS padding, and so the loss, then depends on how the global batch is split) or max_length "
                  "(every batch padded to max_length: the same objective for every split)."},
    )
    pad_to_multiple_of: int | None = field(
        default=None, metadata={"help": "Then round the batch width up to a multiple of this many tokens."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_field_types(self, MaskingConfig)
        for name in ("p_context", "p_future", "trajectory_ratio"):
            _check_probability(name, getattr(self, name))
        if self.p_future == 0:
            raise ValueError(f"p_future={self.p_future}: trajectory samples would mask nothing (p_context may not exceed "
                             "it), so they would teach nothing; the future buckets are the ones masked heavily (paper: 0.95).")
        if self.p_context > self.p_future:
            raise ValueError(f"p_context={self.p_context} above p_future={self.p_future}: a trajectory sample keeps its "
                             "context (buckets revealed so far) mostly visible and masks its future buckets heavily "
                             "(paper: 0.05 and 0.95); swap them.")
        if self.num_buckets < 2 and self.trajectory_ratio > 0:
            raise ValueError(f"num_buckets={self.num_buckets} with trajectory_ratio={self.trajectory_ratio}: one bucket "
                             "holds every token, so a trajectory sample has no future to hide and masks only p_context "
                             "of its tokens; use at least 2 buckets (paper: 8), or trajectory_ratio=0 for plain MDLM.")
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of={self.pad_to_multiple_of}: must be at least 1 (or unset).")
        check_choice("trajectory_selection", self.trajectory_selection, TrajectorySelection)
        check_choice("trajectory_loss_weight", self.trajectory_loss_weight, TrajectoryLossWeight)
        check_choice("noise_schedule", self.noise_schedule, NoiseScheduleName)
        check_choice("padding", self.padding, Padding)
        if not 0.0 < self.min_t < 1.0:
            raise ValueError(f"min_t must be in (0, 1), got {self.min_t}.")


TRAJECTORY_SETTINGS = ("p_context", "p_future", "trajectory_selection", "trajectory_loss_weight")
"""The settings only trajectory samples read: a run with ``trajectory_ratio`` 0 (the MDLM baseline) reads none."""


def check_masking_read(buckets: BucketConfig, given: Iterable[str] | None = None) -> None:
    """Refuse a bucket or masking setting that the others leave unread, as a command's user believes it changes the run:
    ``bucket_seed`` without the random ordering, and the trajectory settings without trajectory samples. Refused are
    the values other than the defaults (a default cannot be told from a value not given), among ``given`` when the
    command knows which the user gave (a recipe's own values stay). The commands' rule, not the settings': a study keeps
    one seed for all its orderings, and its MDLM variant the TRIMS variants' settings."""
    defaults = {f.name: f.default for f in dataclasses.fields(MaskingConfig)}
    named = set(defaults) if given is None else set(given)

    def changed(name: str) -> bool:
        return name in named and getattr(buckets, name) != defaults[name]

    if changed("bucket_seed") and buckets.bucket_ordering != "random":
        raise ValueError(f"bucket_seed={buckets.bucket_seed} seeds the random ordering only, and bucket_ordering is "
                         f"{buckets.bucket_ordering}; drop bucket_seed, or set bucket_ordering=random.")
    if not isinstance(buckets, MaskingConfig) or buckets.trajectory_ratio > 0:
        return
    unread = [f"{name}={getattr(buckets, name)}" for name in TRAJECTORY_SETTINGS if changed(name)]
    if unread:
        them = "them" if len(unread) > 1 else "it"
        raise ValueError(f"{', '.join(unread)}: only trajectory samples read {them}, and trajectory_ratio=0 (the MDLM "
                         f"baseline) draws none; drop {them}, or set trajectory_ratio above 0.")


@dataclass
class DecodingConfig:
    """Settings of :func:`trims_hf.generate`; defaults are the paper's evaluation decoder (Fast-dLLM threshold)."""

    RECORDED_WHEN_SET: ClassVar[tuple[str, ...]] = ("compile_blocks",)
    """Settings added after records existed (:func:`settings_record`)."""
    STRATEGY_SETTINGS: ClassVar[dict[str, tuple[str, ...]]] = {
        "threshold": ("threshold",), "fixed_steps": ("steps",), "entropy": ("entropy_threshold",),
        "factor": ("factor",), "threshold_quota": ("threshold", "steps")}
    """The settings each strategy reads (:func:`trims_hf.generation.steps.build_strategy`); another's does nothing."""

    strategy: StrategyName = field(
        default="threshold",
        metadata={"help": "Commit rule: threshold | fixed_steps | entropy | factor | threshold_quota (LLaDA 2.x: above "
                          "the threshold, at least the step's share of the block)."},
    )
    gen_length: int = field(default=256, metadata={"help": "Number of generated (masked) positions."})
    block_length: int = field(default=32, metadata={"help": "Positions per block; blocks are decoded left to right."})
    threshold: float = field(default=0.9, metadata={"help": "Confidence threshold tau of the threshold strategy."})
    steps: int | None = field(
        default=None, metadata={"help": "Total steps of fixed_steps (split evenly over blocks); default gen_length."}
    )
    entropy_threshold: float = field(default=0.5, metadata={"help": "Entropy (nats) threshold of the entropy strategy."})
    factor: float = field(default=1.0, metadata={"help": "f of the factor strategy: largest n with (n+1)(1-c(n)) <= f."})
    temperature: float = field(default=0.0, metadata={"help": "0 = argmax; > 0 samples proposals from softmax(logits/T)."})
    seed: int | None = field(default=None, metadata={"help": "Seed of the sampling generator (temperature > 0)."})
    cache: CacheMode = field(default="none", metadata={"help": "KV reuse: none | prefix | dual (Fast-dLLM)."})
    step: StepMode = field(
        default="auto",
        metadata={"help": "How each model call runs: eager (transformers builds its mask and cache per call) | static "
                          "(key/value buffers allocated once and written in place, no mask unless a row is padded) | "
                          "graph (static, captured once per shape as a CUDA graph and replayed; CUDA only; refused "
                          "for MoE experts a graph cannot capture: outside bfloat16 on compute capability 9.x/10.x, or "
                          "transformers' eager experts loop) | "
                          "auto (graph on CUDA, static elsewhere and for those MoE students; eager for masked-LM "
                          "students). Same tokens in every mode."},
    )
    compile_blocks: bool = field(
        default=False,
        metadata={"help": "Compile each decoder block of the student in place with torch.compile before decoding (the "
                          "blocks stay compiled): fuses the norms, rotary, SwiGLU and casts into fewer kernels, under "
                          "every step mode (the graph step captures the fused kernels). Lengths are symbolic, so a "
                          "student compiles once, and every block shares the same few graphs (with a KV cache, each is "
                          "handed its own layer). Compiling takes a while and each block call checks guards on the "
                          "host, so it pays off over many generations under the graph step. The fused kernels round "
                          "differently, so tokens are the eager blocks' only where the logits' margins allow."},
    )
    early_stop: bool = field(
        default=True,
        metadata={"help": "Once the block holding a stop token is decoded, fill the rest with EOS and skip its forwards."},
    )
    stop_token_ids: list[int] | None = field(
        default=None, metadata={"help": "Tokens ending a response (e.g. LLaDA's <|eot_id|>); default: the EOS ids."}
    )
    eos_token_id: int | None = field(
        default=None, metadata={"help": "Token written after a stop; default: the model config's (first) EOS id."}
    )

    def __post_init__(self) -> None:
        check_field_types(self, DecodingConfig)
        ids = self.stop_token_ids
        if ids is not None and not (isinstance(ids, (list, tuple)) and all(
                isinstance(i, Integral) and not isinstance(i, bool) for i in ids)):
            raise TypeError(f"stop_token_ids={self.stop_token_ids!r}: must be a list of token ids (ints).")
        check_choice("strategy", self.strategy, StrategyName)
        check_choice("cache", self.cache, CacheMode)
        check_choice("step", self.step, StepMode)
        if self.block_length < 1 or self.gen_length < 1 or self.gen_length % self.block_length:
            raise ValueError(f"gen_length={self.gen_length} must be a positive multiple of block_length={self.block_length}.")
        _check_probability("threshold", self.threshold)
        for name in ("entropy_threshold", "factor", "temperature"):
            _check_non_negative(name, getattr(self, name))
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps={self.steps}: must be at least 1.")
        self.check_given(["steps"] if self.steps is not None else [])
        for name, ids in (("eos_token_id", [self.eos_token_id]), ("stop_token_ids", self.stop_token_ids or [])):
            if any(i is not None and i < 0 for i in ids):
                raise ValueError(f"{name}={getattr(self, name)}: token ids are >= 0.")
        if self.strategy in ("fixed_steps", "threshold_quota") and self.total_steps % self.num_blocks:
            raise ValueError(f"steps={self.total_steps} must be a multiple of the number of blocks ({self.num_blocks}).")
        if self.strategy in ("fixed_steps", "threshold_quota") and self.total_steps > self.gen_length:
            raise ValueError(f"steps={self.total_steps}: more than gen_length={self.gen_length}; a block ends once its "
                             "tokens are committed, so at most gen_length steps run.")
        check_seed("seed", self.seed)
        if self.stop_token_ids is not None:
            self.stop_token_ids = tuple(int(i) for i in self.stop_token_ids)  # hashable, as the decoder keeps it

    def check_given(self, names: Iterable[str]) -> None:
        """Refuse a strategy's setting among ``names`` (the settings the user gave: a default is not given) that this
        strategy does not read: it would change nothing, while the user believes it does."""
        own = self.STRATEGY_SETTINGS[self.strategy]
        for name in names:
            readers = [strategy for strategy, settings in self.STRATEGY_SETTINGS.items() if name in settings]
            if readers and name not in own:
                raise ValueError(f"{name}={getattr(self, name)} does nothing with strategy={self.strategy!r}: only "
                                 f"{' and '.join(readers)} read{'' if len(readers) > 1 else 's'} it; drop it or choose "
                                 "a strategy that does.")

    def check_token_ids(self, vocab_size: int) -> None:
        """``eos_token_id`` and ``stop_token_ids`` are tokens of the model's vocabulary (``vocab_size`` tokens): a stop
        id outside it is never generated, so it would never stop a response."""
        if self.eos_token_id is not None and self.eos_token_id >= vocab_size:
            raise ValueError(f"eos_token_id={self.eos_token_id}: outside the model's vocabulary ({vocab_size} tokens).")
        if outside := [i for i in self.stop_token_ids or () if i >= vocab_size]:
            raise ValueError(f"stop_token_ids: {outside[0]} is outside the model's vocabulary ({vocab_size} tokens), "
                             "so it is never generated and stops nothing.")

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def total_steps(self) -> int:
        """Steps of the fixed_steps and threshold_quota strategies (default: one token per step)."""
        return self.steps if self.steps is not None else self.gen_length


Settings = TypeVar("Settings")


def settings_of(source: Any, cls: type[Settings], **overrides: Any) -> Settings:
    """The ``cls`` part of a larger settings object (e.g. the :class:`MaskingConfig` inside an ``MDLMConfig``)."""
    values = {f.name: getattr(source, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(source, f.name)}
    return cls(**(values | overrides))
