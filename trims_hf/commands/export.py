"""``trims export``: base + adapter -> merged weights or an adapter in the original model's names, with a card."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from . import CommandParser, fail


@dataclass
class ExportArguments:
    """What to export, in which form, and where it goes."""

    model: str = field(metadata={"help": "Hub id or folder of the base student (LLaDA, Dream)."})
    adapter: str = field(metadata={"help": "Hub id or folder of the LoRA adapter (original or native module names)."})
    output: str = field(metadata={"help": "Folder to write the export to (must be new or empty)."})
    format: Literal["merged", "adapter"] = field(
        default="merged", metadata={"help": "merged: base + adapter merged, in the original checkpoint layout; adapter: "
                                    "the adapter with the original code's module names and target_modules."})
    allow_base_mismatch: bool = field(default=False, metadata={"help": "Accept an adapter recorded as trained on a base "
                                                                      "of another name (the same model renamed)."})
    push_to_hub: str | None = field(default=None, metadata={"help": "Hub repo id to upload the export to."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face token for --push-to-hub."})


def main(argv: list[str]) -> int:
    args, = CommandParser((ExportArguments,), prog="trims export",
                          description="Export base + adapter as the original model's layout.").parse(argv)
    from ..data.hub import HubAccessError, check_push_access
    from ..errors import InputError, check_output_folder
    from ..export import export
    from ..students import AdapterError

    try:
        check_output_folder(args.output)
        if args.push_to_hub:
            check_push_access(args.push_to_hub, args.token)
        folder = export(args.model, args.adapter, args.output, args.format, allow_base_mismatch=args.allow_base_mismatch,
                        push_to_hub=args.push_to_hub, token=args.token)
    except (InputError, AdapterError, HubAccessError, OSError) as error:
        return fail(str(error))
    print(f"Exported {args.format} to {folder}" + (f" and pushed to {args.push_to_hub}" if args.push_to_hub else ""))
    return 0


__all__ = ["ExportArguments", "main"]
