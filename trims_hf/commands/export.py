"""``trims export``: base + adapter -> merged weights or an adapter in the original model's names, with a card."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from ..model_config import ModelConfig, StudentKind, flag_name
from . import CommandParser, check_push_flags, fail

FLAGS = {"model_name_or_path": "--model", "adapter": "--adapter", "model_kind": "--model-kind",
         "allow_base_mismatch": "--allow-base-mismatch"}
"""The student settings as this command's flags name them (checks shared with trims eval say them so)."""
_MODEL_FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}
"""The student settings this command shares with :class:`ModelConfig`, whose help it reuses."""


def export_flag(name: str) -> str:
    """A :class:`ModelConfig` field as this command's flag."""
    return FLAGS.get(name, flag_name(name))


@dataclass
class ExportArguments:
    """What to export, in which form, and where it goes."""

    model: str = field(metadata={"help": "Hub id or folder of the base student (LLaDA, Dream)."})
    adapter: str = field(metadata={"help": "Hub id or folder of the LoRA adapter (original or native module names)."})
    output: str = field(metadata={"help": "Folder to write the export to (new or empty, unless --overwrite)."})
    format: Literal["merged", "adapter"] = field(
        default="merged", metadata={"help": "merged: base + adapter merged, in the original checkpoint layout; adapter: "
                                    "the adapter with the original code's module names and target_modules."})
    model_kind: StudentKind | None = field(
        default=None, metadata=_MODEL_FIELDS["model_kind"].metadata)
    allow_base_mismatch: bool = field(default=False, metadata=_MODEL_FIELDS["allow_base_mismatch"].metadata)
    overwrite: bool = field(default=False, metadata={"help": "Write into an existing, non-empty output folder (its "
                                                              "files of the same names are replaced)."})
    push_to_hub: str | None = field(default=None, metadata={"help": "Hub repo id to upload the export to."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face token for --push-to-hub."})


def main(argv: list[str]) -> int:
    args, = CommandParser((ExportArguments,), prog="trims export",
                          description="Export base + adapter as the original model's layout.").parse(argv)
    from ..data.hub import HubAccessError, check_push_access
    from ..errors import InputError, check_apart, check_output_path
    from ..exporting import export
    from ..model_config import check_model_sources, student_kind
    from ..students import AdapterError

    student = ModelConfig(args.model, model_kind=args.model_kind, adapter=args.adapter,
                          allow_base_mismatch=args.allow_base_mismatch)
    try:
        for flag, source in (("--model", args.model), ("--adapter", args.adapter)):
            if source is not None:
                check_apart(args.output, f"--output {args.output}", source, f"{flag} {source}", "a model", inside=True)
        check_output_path(args.output, f"--output {args.output}", existing="reuse" if args.overwrite else "empty",
                          advice=" or pass --overwrite")
        check_push_flags(args.push_to_hub, token=args.token)
        check_model_sources(student, export_flag)
        kind = student_kind(student, student.config_dict(), export_flag)
        if args.push_to_hub:
            check_push_access(args.push_to_hub, args.token)
        folder = export(args.model, args.adapter, args.output, args.format, model_kind=kind,
                        allow_base_mismatch=args.allow_base_mismatch, push_to_hub=args.push_to_hub, token=args.token)
    except (InputError, AdapterError, HubAccessError, OSError) as error:
        return fail(str(error))
    print(f"Exported {args.format} to {folder}" + (f" and pushed to {args.push_to_hub}" if args.push_to_hub else ""))
    return 0


__all__ = ["ExportArguments", "main"]
