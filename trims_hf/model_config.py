"""Which student to load, declared once (as TRL's ``ModelConfig``), and the one way it is resolved and loaded.

``trims train`` (recipe keys), ``trims eval`` (flags), the lm-evaluation-harness model (``--model_args``) and the
recipes all describe a student with :class:`ModelConfig` and go through :func:`check_model_sources`,
:func:`resolve_student` and :func:`load_model`, so a student's kind, mask id, dtype, adapter and tokenizer are
found the same way everywhere, and every mistake is found before any weight is read. Messages name the fields
through a ``name`` function, so one message reads as a recipe key (``model_kind``) or a flag (``--model-kind``).

The dataclass imports neither torch nor transformers, so ``trims ... --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import InputError
from .settings import check_choice

# The keys of trims_hf.students.STUDENTS (tested), torch-free here.
StudentKind = Literal["llada", "llada_moe", "llada2", "dream", "masked_lm"]
Dtype = Literal["auto", "bfloat16", "float16", "float32"]
FieldName = Callable[[str], str]
"""How a message names a field: as itself (a recipe key, a keyword argument) or as a flag (:func:`flag_name`)."""


def flag_name(name: str) -> str:
    """A field as a command-line flag: ``model_kind`` -> ``--model-kind``."""
    return "--" + name.replace("_", "-")


def field_name(name: str) -> str:
    """A field as a recipe key or keyword argument: itself."""
    return name


@dataclass
class ModelConfig:
    """A masked-diffusion student: weights, family, mask token, dtype, adapter and tokenizer."""

    model_name_or_path: str = field(
        metadata={"help": "Student Hub id or local folder (weights and config; LLaDA, LLaDA-MoE, LLaDA 2.x, Dream or a masked "
                          "LM).",
                  "aliases": ["--model"]},
    )
    model_revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit) of the student."})
    model_kind: StudentKind | None = field(
        default=None,
        metadata={"help": "Student family; default: detected from the config. Needed for a plain causal LM (Llama, "
                  "Qwen2) trained as a student: llada (logits unshifted) or dream (logits shifted by one)."},
    )
    mask_token_id: int | None = field(
        default=None, metadata={"help": "Mask token id; default: the student config's, else its tokenizer's mask token."}
    )
    dtype: Dtype = field(default="auto", metadata={"help": "Weight dtype to load the student in."})
    attn_implementation: str | None = field(default=None, metadata={"help": "e.g. sdpa, flash_attention_2, eager."})
    adapter: str | None = field(
        default=None,
        metadata={"help": "Hub id or folder of a peft adapter on top of the student: merged into it for decoding, "
                  "trained further by trims train (merged first with use_lora false)."},
    )
    allow_base_mismatch: bool = field(
        default=False, metadata={"help": "Accept an adapter recorded as trained on another base: one of another name "
                                 "(the same model renamed), or one whose weights differ from those trims train recorded "
                                 "beside the adapter (trims_base.json)."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer Hub id or folder, when not the student's.", "aliases": ["--tokenizer"]}
    )

    def __post_init__(self) -> None:
        if self.model_kind is not None:
            check_choice("model_kind", self.model_kind, StudentKind)
        check_choice("dtype", self.dtype, Dtype)

    def torch_dtype(self) -> Any:
        """``dtype`` as ``from_pretrained`` takes it (``"auto"`` or a ``torch.dtype``)."""
        import torch

        return self.dtype if self.dtype == "auto" else getattr(torch, self.dtype)

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """The loading options of the weights: dtype and, when set, the attention implementation."""
        kwargs = {"dtype": self.torch_dtype()}
        if self.attn_implementation:
            kwargs["attn_implementation"] = self.attn_implementation
        return kwargs

    def config_dict(self) -> dict[str, Any]:
        """The student's ``config.json`` (no weights are read)."""
        from transformers import PreTrainedConfig

        return PreTrainedConfig.get_config_dict(self.model_name_or_path, revision=self.model_revision)[0]


@dataclass(frozen=True)
class ResolvedStudent:
    """What a student is, found from its config and tokenizer before any weight is read."""

    kind: str
    mask_token_id: int
    tokenizer: Any
    config: dict[str, Any]
    """The ``config.json`` dict (for checks such as the sequence length)."""

    @property
    def vocab_size(self) -> int | None:
        """The vocabulary the student generates from, read from its config (token ids are checked against it)."""
        from .students.registry import student_config

        return getattr(student_config(self.config, self.kind).get_text_config(), "vocab_size", None)


def check_model_sources(model: ModelConfig, name: FieldName = field_name) -> None:
    """Student, adapter and tokenizer exist locally or on the Hub (seconds), and none is given in another's place."""
    from .sources import check_model_source

    folder = Path(model.model_name_or_path).expanduser()
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        raise InputError(f"{name('model_name_or_path')} {model.model_name_or_path} is a peft adapter; pass it to "
                         f"{name('adapter')} and its base model to {name('model_name_or_path')}.")
    check_model_source(name("model_name_or_path"), model.model_name_or_path, revision=model.model_revision, gguf=False)
    if model.adapter is not None:
        adapter = Path(model.adapter).expanduser()
        if adapter.is_dir():
            if not (adapter / "adapter_config.json").is_file():
                raise InputError(f"{name('adapter')} {model.adapter}: the folder has no adapter_config.json (a full "
                                 f"model goes to {name('model_name_or_path')}).")
        else:
            check_model_source(name("adapter"), model.adapter, gguf=False)
        from .students.adapters import AdapterError, adapter_folder, check_adapter_base, read_adapter

        try:
            check_adapter_base(read_adapter(adapter_folder(model.adapter))[0], model.model_name_or_path, model.adapter,
                               model.allow_base_mismatch)
        except AdapterError as error:
            raise InputError(str(error)) from None
    if model.tokenizer_name_or_path is not None and not Path(model.tokenizer_name_or_path).expanduser().is_dir():
        check_model_source(name("tokenizer_name_or_path"), model.tokenizer_name_or_path, gguf=False)


TOKENIZER_FILES = ("tokenizer*", "vocab*", "*.model", "*.tiktoken")
"""What a folder holding a tokenizer has one of: tokenizers' and transformers' files, sentencepiece, tiktoken."""


def _tokenizer_source(model: ModelConfig, name: FieldName) -> tuple[str, str]:
    """Where the tokenizer comes from, as messages name it (``tokenizer_name_or_path X``, else ``model_name_or_path
    X``), and the advice to set ``tokenizer_name_or_path`` when it was not given."""
    if model.tokenizer_name_or_path:
        return f"{name('tokenizer_name_or_path')} {model.tokenizer_name_or_path}", ""
    return f"{name('model_name_or_path')} {model.model_name_or_path}", f"; set {name('tokenizer_name_or_path')}"


def load_tokenizer(model: ModelConfig, name: FieldName = field_name) -> Any:
    """The student's tokenizer: ``tokenizer_name_or_path``'s, else the student folder's."""
    from .students import load_student_tokenizer

    source = model.tokenizer_name_or_path or model.model_name_or_path
    where, hint = _tokenizer_source(model, name)
    folder = Path(source).expanduser()
    if folder.is_dir() and not any(any(folder.glob(pattern)) for pattern in TOKENIZER_FILES):
        raise InputError(f"{where}: the folder holds no tokenizer (tokenizer.json, tokenizer_config.json, a "
                         f"vocabulary){hint}.")
    try:
        return load_student_tokenizer(source, revision=None if model.tokenizer_name_or_path else model.model_revision)
    except (OSError, ValueError, TypeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"{where}: cannot load a tokenizer ({reason}){hint}.") from None


def student_kind(model: ModelConfig, config: dict[str, Any], name: FieldName = field_name) -> str:
    """The student's family: ``model_kind``, else detected from its ``config`` (a plain causal LM cannot be)."""
    from .students import StudentKindError, detect_student_kind

    try:
        return model.model_kind or detect_student_kind(config)
    except StudentKindError as error:
        raise InputError(f"{name('model_name_or_path')} {model.model_name_or_path} is a plain causal LM "
                         f"('{error.model_type}'); say how it was trained as a diffusion student: {name('model_kind')} "
                         f"llada (logits unshifted) or {name('model_kind')} dream (logits shifted by one).") from None


def resolve_student(model: ModelConfig, name: FieldName = field_name, tokenizer: Any = None) -> ResolvedStudent:
    """The student's kind (``model_kind`` or detected), tokenizer (``tokenizer`` if given, else :func:`load_tokenizer`)
    and mask id (``mask_token_id``, its config's or its tokenizer's, within the vocabulary), from its config alone."""
    from .students import MaskTokenError, student_mask_token_id

    config = model.config_dict()
    path = f"{name('model_name_or_path')} {model.model_name_or_path}"
    kind = student_kind(model, config, name)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model, name)
    try:
        mask_id = student_mask_token_id(config, kind, model.mask_token_id, tokenizer)
    except MaskTokenError as error:
        if model.mask_token_id is not None:
            raise InputError(f"{name('mask_token_id')} {model.mask_token_id}: {error} of {path}.") from None
        raise InputError(f"{path}: no mask token id in its config or tokenizer; set {name('mask_token_id')}.") from None
    student = ResolvedStudent(kind, mask_id, tokenizer, config)
    check_tokenizer_is_the_students(student, model, name)
    return student


def check_tokenizer_is_the_students(student: ResolvedStudent, model: ModelConfig, name: FieldName = field_name) -> None:
    """A tokenizer with ids past the student's vocabulary, or one given apart whose mask token is not the student's,
    belongs to another model: refused before the weights load (it would fail on the first batch, or train on ids that
    mean other tokens)."""
    path = f"{name('model_name_or_path')} {model.model_name_or_path}"
    whose, hint = _tokenizer_source(model, name)
    whose = whose if model.tokenizer_name_or_path else f"the tokenizer of {whose}"
    tokens = len(student.tokenizer) if hasattr(student.tokenizer, "__len__") else None
    if tokens is not None and student.vocab_size is not None and tokens > student.vocab_size:
        raise InputError(f"{whose}: {tokens:,} tokens, more than the {student.vocab_size:,} of the student's vocabulary "
                         f"({path}): it is not the student's tokenizer{hint}.")
    own = getattr(student.tokenizer, "mask_token_id", None)
    if model.tokenizer_name_or_path and model.mask_token_id is None and own is not None and own != student.mask_token_id:
        raise InputError(f"{whose}: its mask token is id {own}, the student's is {student.mask_token_id} ({path}'s config): "
                         f"it is not the student's tokenizer (or set {name('mask_token_id')}).")


def load_model(model: ModelConfig, student: ResolvedStudent, *, train_adapter: bool = False) -> Any:
    """The student's weights as :func:`resolve_student` found it, with its adapter: merged (the decoder then runs the
    plain student, as fast as without one), or kept trainable with ``train_adapter``."""
    from .students import load_student

    loaded = load_student(model.model_name_or_path, student.kind, revision=model.model_revision,
                          mask_token_id=student.mask_token_id, **model.from_pretrained_kwargs())
    if model.adapter is None:
        return loaded
    from .students import AdapterError, load_adapter

    try:  # every tensor loaded, with the original or the native module names, or an error naming the keys
        with_adapter = load_adapter(loaded, model.adapter, revision=None, allow_base_mismatch=model.allow_base_mismatch)
    except AdapterError as error:
        raise InputError(str(error)) from None
    return with_adapter if train_adapter else with_adapter.merge_and_unload()


__all__ = [
    "ModelConfig",
    "ResolvedStudent",
    "check_model_sources",
    "field_name",
    "flag_name",
    "load_model",
    "load_tokenizer",
    "resolve_student",
]
