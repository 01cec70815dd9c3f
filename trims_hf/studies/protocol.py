"""A study's protocol: every setting it is run with, declared once before it runs, and its fingerprint.

:class:`StudyProtocol` holds the library's settings (masking, decoding, student format) rather than copies of their
fields, plus what a study adds (steps, thresholds, the trace policy); ``trims demo`` and ``recipes/smollm2`` extend
it. The fingerprint of every field, and of the library defaults they resolve to, is recorded with each output, and a
study folder refuses another protocol. This module imports neither torch nor transformers, so a study's command line
checks its protocol in a moment.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import inspect
import json
import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..reports import write_atomic
from ..settings import (
    TRAJECTORY_SETTINGS,
    BucketConfig,
    DecodingConfig,
    MaskingConfig,
    ScoringOptions,
    StudentFormat,
    check_seed,
    settings_of,
    settings_record,
)

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from ..training.config import MDLMConfig


VARIANTS: dict[str, tuple[bool, str]] = {
    "MDLM": (False, "hard_to_easy"),
    "TRIMS hard-to-easy": (True, "hard_to_easy"),
    "TRIMS easy-to-hard": (True, "easy_to_hard"),
    "TRIMS random": (True, "random"),
}
"""name -> (trajectory masking, bucket ordering): the TRIMS variants mask with the protocol's ``trajectory_ratio``,
the MDLM baseline uses the same collator with ratio 0."""
BASE = "base (before SFT)"
BUCKET_FIELDS = tuple(f"masking.{f.name}" for f in dataclasses.fields(BucketConfig))
"""The masking fields the teacher's buckets depend on: a score stage's part of the masking."""
TRAJECTORY_ONLY = (*TRAJECTORY_SETTINGS, "bucket_ordering")
"""Masking settings that only trajectory rows read (which rows, their two mask probabilities, their loss weight) and the
bucket ordering, which the base takes from MDLM's entry of :data:`VARIANTS`. At ratio 0 the collator draws the same
numbers whatever they are (``fixed_subset`` keeps ``per_draw``'s streams aligned), and a base trains with them at their
defaults (:meth:`StudyProtocol.student_args`)."""
MDLM_MASKING_FIELDS = tuple(f"masking.{f.name}" for f in dataclasses.fields(MaskingConfig)
                            if f.name not in ("trajectory_ratio", *TRAJECTORY_ONLY))
"""The masking fields an MDLM-trained base depends on: all but the trajectory ratio, which it trains at 0, and the
:data:`TRAJECTORY_ONLY` settings, so that a study that changes only those reuses the bases."""


Protocol = TypeVar("Protocol")


def flat(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested record with dotted keys (``masking.p_future``), so that a changed setting is named by its path."""
    items: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, Mapping):
            items.update(flat(value, f"{prefix}{key}."))
        else:
            items[f"{prefix}{key}"] = value
    return items


def protocol_record(protocol: Any) -> dict[str, Any]:
    """Every field of a (dataclass) protocol, those of the settings it holds included, plus what its ``resolved()``
    returns when it has one (the library defaults the settings resolve to), so that a changed library default is a
    changed protocol too."""
    record = settings_record(protocol)
    if callable(resolved := getattr(protocol, "resolved", None)):
        record["resolved"] = resolved()
    return flat(json.loads(json.dumps(record, default=str)))


def fingerprint(protocol: Any, fields: Sequence[str] | None = None) -> str:
    """A short hash of :func:`protocol_record`, or of the part of it under ``fields`` (and what they resolve to):
    what each output of a study records. A field is a top-level name (``masking``: all of it) or a dotted path
    (``masking.p_future``: that setting alone)."""
    record = protocol_record(protocol)
    if fields is not None:
        prefixes = tuple(f"{name}." for name in (*fields, "resolved"))
        record = {k: v for k, v in record.items() if k in fields or k.startswith(prefixes)}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]


def with_overrides(protocol: Protocol, assignments: Sequence[str]) -> Protocol:
    """``protocol`` with ``FIELD=VALUE`` assignments applied (:func:`parse_setting`: the field's own type, tuple
    fields comma-separated; ``masking.p_future=0.9`` sets a field of a setting the protocol holds); ValueError names
    the assignment. The checks of the protocol and of the settings it holds run on the result."""
    fields = {f.name: f for f in dataclasses.fields(protocol)}
    changes: dict[str, Any] = {}
    for assignment in assignments:
        name, sep, text = assignment.partition("=")
        head, dot, rest = name.partition(".")
        if dot and head in fields and dataclasses.is_dataclass(getattr(protocol, head)):
            try:
                changes[head] = with_overrides(changes.get(head, getattr(protocol, head)), [f"{rest}={text}"])
            except ValueError as error:
                raise ValueError(f"{head}.{error}") from None
            continue
        if not sep or name not in fields:
            raise ValueError(f"{assignment}: expected FIELD=VALUE with FIELD one of {', '.join(fields)}.")
        try:
            changes[name] = parse_setting(declared_type(type(protocol), fields[name]), getattr(protocol, name), text)
        except ValueError as error:
            raise ValueError(f"{assignment}: {error}") from None
    return dataclasses.replace(protocol, **changes)


def declared_type(cls: type, field: dataclasses.Field) -> str:
    """The annotation of ``field`` as its class declares it, as text (``int | None``). Read from the class, not from
    ``field.type``: HfArgumentParser resolves that in place and drops the ``None`` of an optional field."""
    for klass in cls.__mro__:
        annotation = vars(klass).get("__annotations__", {}).get(field.name)
        if annotation is not None:
            return annotation if isinstance(annotation, str) else repr(annotation)
    return field.type if isinstance(field.type, str) else repr(field.type)


def parse_setting(annotation: str, current: Any, text: str) -> Any:
    """``text`` as a value of a field declared ``annotation`` (:func:`declared_type`): of its current value's type,
    or, where that says nothing (None, an empty tuple), of its annotation's; a tuple or list comma-separated, a bool
    from true/false, ``none`` for an optional field's None."""
    if text.lower() == "none" and "None" in annotation:
        return None
    kind = type(current) if current is not None else annotated_type(annotation)
    if kind in (tuple, list):
        element = type(current[0]) if current else annotated_type(annotation.partition("[")[2])
        return kind(parse_scalar(element, part) for part in text.split(",") if part)
    return parse_scalar(kind, text)


def annotated_type(annotation: str) -> type:
    """The first of tuple, list, bool, int, float, str an annotation's text names (``int | None`` -> int)."""
    for kind in (tuple, list, bool, int, float, str):
        if re.search(rf"\b{kind.__name__}\b", annotation):
            return kind
    raise ValueError(f"cannot be set from the command line ({annotation}).")


def parse_scalar(kind: type, text: str) -> Any:
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(f"{text!r} is not true or false.")
        return text.lower() == "true"
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a valid {kind.__name__}.") from None


def field_help(cls: type) -> dict[str, str]:
    """What each field of a dataclass means: its ``metadata["help"]`` (the settings' style) or the docstring under it
    in the class body (the protocols' style), a subclass's over its base's."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # a builtin base, or a class without a source file
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    docs.update({f.name: f.metadata["help"] for f in dataclasses.fields(cls) if "help" in f.metadata})
    return docs


def settings(protocol: Any) -> list[tuple[str, str, str]]:
    """Every field ``--set FIELD=VALUE`` can change, as (``FIELD``, ``VALUE`` as it would be typed, what it means); a
    setting the protocol holds field by field (``decoding.threshold``)."""
    rows = []
    docs = field_help(type(protocol))
    for f in dataclasses.fields(protocol):
        value = getattr(protocol, f.name)
        nested = dataclasses.is_dataclass(value)
        rows += ([(f"{f.name}.{g.name}", getattr(value, g.name), field_help(type(value)).get(g.name, ""))
                  for g in dataclasses.fields(value)] if nested else [(f.name, value, docs.get(f.name, ""))])
    return [(name, ",".join(map(str, value)) if isinstance(value, tuple) else str(value), meaning)
            for name, value, meaning in rows]


def describe_fields(protocol: Any) -> str:
    """Every field ``--set FIELD=VALUE`` can change, as it would be typed with its value in ``protocol``, and what it
    means: what a study command's ``--fields`` prints."""
    lines = []
    for name, shown, meaning in settings(protocol):
        lines.append(f"{name}={shown}")
        lines += textwrap.wrap(meaning, 100, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def changed_settings(protocol: Any, reference: Any) -> list[str]:
    """The ``FIELD=VALUE`` assignments that make ``reference`` into ``protocol`` (:func:`with_overrides` reads them):
    how a run records the settings it was given, so that a later run can take them up."""
    before = {name: shown for name, shown, _ in settings(reference)}
    return [f"{name}={shown}" for name, shown, _ in settings(protocol) if before.get(name) != shown]


PROTOCOL_FILE = "protocol.json"


def check_protocol(folder: Path, protocol: Any) -> None:
    """Refuse a study folder started under another protocol, naming each changed field (nothing is written):
    a pre-registered protocol is never mixed with a changed one, so a change is a new study in a new folder."""
    path = folder / PROTOCOL_FILE
    if not path.is_file():
        return
    recorded = json.loads(path.read_text())
    if recorded["fingerprint"] == fingerprint(protocol):
        return
    now = protocol_record(protocol)
    changed = [f"{k} ({recorded['protocol'].get(k)} -> {now[k]})" for k in now if recorded["protocol"].get(k) != now[k]]
    raise ValueError(f"holds the study of protocol {recorded['fingerprint']}; this protocol ({fingerprint(protocol)}) "
                     f"differs in {', '.join(changed)}. A changed protocol is a new study: use a new folder.")


def record_protocol(folder: Path, protocol: Any, sources: Mapping[str, str] | None = None) -> None:
    """Write the protocol, its fingerprint and the ``sources`` it ran on (e.g. a weights file's sha256) into the
    study folder (what :func:`check_protocol` and :func:`changed_sources` compare with)."""
    write_atomic(folder / PROTOCOL_FILE, json.dumps({"fingerprint": fingerprint(protocol),
                                                     "protocol": protocol_record(protocol),
                                                     "sources": dict(sources or {})}, indent=1))


def changed_sources(folder: Path, sources: Mapping[str, str]) -> list[str]:
    """``name (recorded -> now)`` of each source that differs from the one the study in ``folder`` started on:
    the same protocol on other weights is another study too."""
    path = folder / PROTOCOL_FILE
    recorded = json.loads(path.read_text()).get("sources", {}) if path.is_file() else {}
    return [f"{k} ({recorded[k]} -> {v})" for k, v in sources.items() if k in recorded and recorded[k] != v]


TRAINING_DEFAULTS: dict[str, Any] = {"lr_scheduler_type": "cosine", "warmup_steps": 0.05, "weight_decay": 0.1}
"""The optimisation settings every study run shares (a study's protocol fingerprint records them)."""


def training_arguments(cls: type[TrainingArguments], folder: Path, steps: int, lr: float, batch_size: int, seed: int,
                       device: str = "cpu", **extra: Any) -> TrainingArguments:
    """The study's training settings: cosine schedule, short warmup, no checkpoints (the callers save); bf16 on a
    GPU, float32 on a CPU."""
    cuda = device == "cuda"
    return cls(
        output_dir=str(folder), max_steps=steps, per_device_train_batch_size=batch_size, learning_rate=lr,
        **TRAINING_DEFAULTS, logging_steps=max(1, steps // 5),
        save_strategy="no", report_to="none", use_cpu=not cuda, bf16=cuda, seed=seed, disable_tqdm=False,
        remove_unused_columns=False, dataloader_num_workers=0, **extra,
    )


TEACHER_CONTEXT_FACTOR = 4
"""The teacher's context in student lengths (scoring and traces): the teacher's tokenizer may cut the same text
finer than the student's, and a row must never be cut for the teacher where the student still sees it."""


def check_head_width(hidden_size: int, num_heads: int) -> None:
    """A tiny model's heads split its width evenly, into a whole even number of dimensions each (rotary positions
    pair them): else transformers refuses the config, or the rotary product fails, once a stage has run."""
    if hidden_size % num_heads or hidden_size // num_heads % 2:
        raise ValueError(f"hidden_size={hidden_size}, num_heads={num_heads}: each head takes hidden_size / num_heads "
                         "dimensions, which must be a whole even number (rotary positions pair them).")


@dataclasses.dataclass(frozen=True)
class StudyProtocol:
    """What every study declares: the library settings it trains and decodes with (held, never copied into fields of
    its own), the sizes of its training runs, the thresholds it evaluates at and how much it traces. A study's own
    protocol (``trims demo``'s, ``recipes/smollm2``'s) extends it with its data, models and seeds."""

    masking: MaskingConfig = dataclasses.field(default_factory=MaskingConfig)
    """Buckets and masking: the TRIMS variants train with it, the MDLM ones with its ``trajectory_ratio`` at 0."""
    decoding: DecodingConfig = dataclasses.field(default_factory=DecodingConfig)
    """The decoder of every evaluation; each evaluation replaces its threshold by one of :attr:`thresholds`."""
    student_format: StudentFormat = dataclasses.field(default_factory=StudentFormat)
    """How scored rows become student tokens; its ``max_length`` is also the length the teacher's buckets are cut
    over (:meth:`scoring_options`)."""
    batch_size: int = 32
    """Rows per optimizer step, for the base and every variant (and a study's own pretraining)."""
    base_steps: int = 500
    """Optimizer steps of the MDLM base, trained from the pretrained model made a student."""
    base_lr: float = 1e-3
    """Peak learning rate of the base (cosine schedule, :data:`TRAINING_DEFAULTS`)."""
    variant_steps: int = 150
    """Optimizer steps of each variant, continued from the base."""
    variant_lr: float = 3e-4
    """Peak learning rate of each variant."""
    thresholds: tuple[float, ...] = (0.5, 0.7, 0.9, 0.95)
    """Every model is evaluated at these right after it is trained."""
    variants: tuple[str, ...] = tuple(VARIANTS)
    """The models continued from the base (names of :data:`VARIANTS`), in this order for each seed."""
    tail_variants: tuple[str, ...] = ()
    """Variants run after all of :attr:`variants`, when time is left (the start of the pre-registered tail)."""
    tail_thresholds: tuple[float, ...] = ()
    """Thresholds every model is evaluated at last, when time is left (the end of the tail)."""
    eval_batch_size: int = 500
    """Problems decoded together (left padding)."""
    trace_samples: int = 16
    """Problems whose decode order and per-step teacher NLL are traced per model (:meth:`traced`)."""

    EVALUATE_BASE: ClassVar[bool] = True
    """Whether the models stage evaluates the base too (a study that measures its base in a stage of its own, before
    any variant, leaves it out)."""
    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = ("batch_size", "base_steps", "variant_steps", "trace_samples",
                                                  "eval_batch_size")
    """The count fields that must be at least 1; a study extends the tuple with its own."""
    STAGE_FIELDS: ClassVar[Mapping[str, Sequence[str]]] = {}
    """Stage -> the fields its outputs depend on, for a study that reuses a folder's finished stages under a changed
    protocol (the demo); a stage not named here depends on every field."""

    def __post_init__(self) -> None:
        """The sizes, variants and every threshold checked at once (the contained settings check themselves), so a
        bad override fails in one line before anything runs."""
        if not self.thresholds:
            raise ValueError("thresholds: needs at least one value.")
        if not self.variants:
            raise ValueError("variants: needs at least one value.")
        if unknown := [name for name in (*self.variants, *self.tail_variants) if name not in VARIANTS]:
            raise ValueError(f"variant {unknown[0]!r}: choose from {', '.join(VARIANTS)}.")
        if small := [name for name in self.POSITIVE_FIELDS if getattr(self, name) < 1]:
            raise ValueError(f"{small[0]}={getattr(self, small[0])}: must be at least 1.")
        if (heads := getattr(self, "num_heads", None)) is not None:
            check_head_width(self.hidden_size, heads)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("_lr") and not 0 < value < math.inf:  # NaN fails too
                raise ValueError(f"{field.name}={value}: must be a finite number > 0.")
            if field.name.endswith("seed"):
                check_seed(field.name, value)
            if field.name == "seeds":
                for seed in value:
                    check_seed("seeds", seed)
            if isinstance(value, tuple) and (twice := [v for i, v in enumerate(value) if v in value[:i]]):
                raise ValueError(f"{field.name}: {twice[0]} is given twice; each value once.")
        for name, values in self.decoded_thresholds().items():
            for tau in values:
                try:
                    self.decoding_at(tau)
                except ValueError as error:
                    raise ValueError(f"{name}: {error}") from None

    def decoded_thresholds(self) -> dict[str, tuple[float, ...]]:
        """Every threshold this protocol decodes at, by the field that sets it (a study with more evaluations adds
        its own)."""
        return {"thresholds": self.thresholds, "tail_thresholds": self.tail_thresholds}

    def sft_seeds(self) -> tuple[int, ...]:
        """The seeds the variants are trained with; the first one is traced."""
        raise NotImplementedError

    def base_seed(self) -> int:
        """The seed of the base's MDLM training."""
        raise NotImplementedError

    def fingerprint(self, stage: str | None = None) -> str:
        """The fingerprint of the whole protocol, or of what ``stage``'s outputs depend on (:attr:`STAGE_FIELDS`)."""
        return fingerprint(self, None if stage is None else self.STAGE_FIELDS.get(stage))

    def decoding_at(self, tau: float) -> DecodingConfig:
        return dataclasses.replace(self.decoding, threshold=tau)

    def trace_threshold(self) -> float:
        """The threshold the traces are taken at: the one nearest the paper's 0.9."""
        return min(self.thresholds, key=lambda tau: abs(tau - 0.9))

    def traced(self, tau: float, seed: int | None) -> bool:
        """The trace policy: the base (no seed) and the first seed's variants, at :meth:`trace_threshold`."""
        return tau == self.trace_threshold() and seed in (None, self.sft_seeds()[0])

    @property
    def teacher_context(self) -> int:
        return TEACHER_CONTEXT_FACTOR * self.student_format.max_length

    def scoring_options(self) -> ScoringOptions:
        """The teacher's scoring: :attr:`teacher_context` tokens, buckets cut over what training keeps."""
        return ScoringOptions(teacher_max_length=self.teacher_context, train_max_length=self.student_format.max_length)

    def bucket_config(self, ordering: str | None = None) -> BucketConfig:
        return settings_of(self.masking, BucketConfig, **({"bucket_ordering": ordering} if ordering else {}))

    def variant(self, name: str) -> tuple[float, str]:
        """(trajectory ratio, bucket ordering) of a variant of :data:`VARIANTS`: MDLM 0, TRIMS the masking's ratio."""
        trajectory, ordering = VARIANTS[name]
        return (self.masking.trajectory_ratio if trajectory else 0.0), ordering

    def student_args(self, folder: Path, name: str, seed: int, device: str = "cpu") -> MDLMConfig:
        """The MDLMConfig of the base (``name`` :data:`BASE`: MDLM masking, the base's steps, the
        :data:`TRAJECTORY_ONLY` settings it never reads at their defaults) or of a variant."""
        from ..training.config import MDLMConfig

        steps, lr = (self.base_steps, self.base_lr) if name == BASE else (self.variant_steps, self.variant_lr)
        ratio, ordering = self.variant("MDLM" if name == BASE else name)
        unread = {f: getattr(MaskingConfig(), f) for f in TRAJECTORY_ONLY} if name == BASE else {}
        masking = dataclasses.replace(self.masking, **{**unread, "trajectory_ratio": ratio, "bucket_ordering": ordering})
        return training_arguments(MDLMConfig, folder, steps, lr, self.batch_size, seed, device,
                                  **dataclasses.asdict(masking), **dataclasses.asdict(self.student_format))

    def resolved(self) -> dict[str, Any]:
        """What the protocol resolves to beyond its fields (fingerprinted with them): a changed library default
        changes the study."""
        return {"scoring": dataclasses.asdict(self.scoring_options()), "training": TRAINING_DEFAULTS}


class LeveledOneSeedProtocol(StudyProtocol):
    """A study over difficulty levels whose base and variants share one seed (one base per seed) and whose base is also
    decoded at a selection threshold: the regime study's and SmolLM2's replication. Declares no fields: the subclass
    declares ``levels``, ``chain_steps``, ``seed`` and ``selection_threshold``."""

    levels: tuple[int, ...]
    chain_steps: int
    seed: int
    selection_threshold: float

    def __post_init__(self) -> None:
        from .arith import check_level

        if not self.levels:
            raise ValueError("levels: needs at least one value.")
        for level in self.levels:
            try:
                check_level(level, self.chain_steps)
            except ValueError as error:
                raise ValueError(f"levels: {error}") from None
        super().__post_init__()

    def decoded_thresholds(self) -> dict[str, tuple[float, ...]]:
        return {**super().decoded_thresholds(), "selection_threshold": (self.selection_threshold,)}

    def sft_seeds(self) -> tuple[int, ...]:
        return (self.seed,)

    def base_seed(self) -> int:
        return self.seed

