"""The ``trims`` command line: ``trims <command> [flags]``, each command in ``trims_hf/commands/<command>.py``.

Only the chosen command's module is imported, so ``trims --help`` imports nothing heavy.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import version

from .determinism import sleep_while_waiting

# command -> (module with main(argv), one-line help)
COMMANDS = {
    "score": ("trims_hf.commands.score", "Score completions with an autoregressive teacher (NLL, entropy, buckets)."),
    "train": ("trims_hf.commands.train", "Fine-tune a masked diffusion student with TRIMS (or MDLM) from a YAML recipe."),
    "eval": ("trims_hf.commands.eval", "Evaluate a student on a benchmark: accuracy and tokens per step."),
    "export": ("trims_hf.commands.export", "Export base + adapter as merged weights or an adapter in the original layout."),
    "lm-eval": ("trims_hf.evaluation.harness.__main__",
                "lm-evaluation-harness with the `trims` model (pip install trims_hf[lm_eval])."),
    "demo": ("trims_hf.studies.demo.command", "Run the whole TRIMS chain offline on a small embedded task."),
}


def usage() -> str:
    lines = ["usage: trims <command> [flags]   (`trims <command> --help` lists a command's flags)",
             "       trims --version", "", "commands:"]
    return "\n".join(lines + [f"  {name:<8} {help}" for name, (_, help) in COMMANDS.items()])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv and argv[0] == "--version":
        print(f"trims_hf {version('trims_hf')}")
        return 0
    if not argv or argv[0] not in COMMANDS:
        problem = f"unknown command {argv[0]!r}" if argv else "no command given"
        print(f"error: {problem}; choose one of {', '.join(COMMANDS)} (`trims --help` describes them).", file=sys.stderr)
        return 2
    sleep_while_waiting()  # before a command loads torch
    try:
        code = int(importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:]) or 0)
    except SystemExit as exit:  # argparse's --help and usage errors, as an exit code for callers of main()
        code = exit.code if isinstance(exit.code, int) else 1
    except KeyboardInterrupt:  # one the command does not report itself (e.g. while it imports its libraries)
        from .commands import INTERRUPTED, fail

        return fail(f"interrupted: `trims {argv[0]}` stopped before it finished.", INTERRUPTED)
    leave_process_group()
    return code


def leave_process_group() -> None:
    """Destroy the process group a command that ended (not one that raised) joined, while the interpreter is whole.

    Why: a gloo group left to interpreter exit can abort a finished process (SIGABRT, "terminate called without an
    active exception") when its worker threads free tensors during teardown; torch asks programs to destroy the group
    at the end, and ``Trainer`` does not. Not after an exception: other processes may still wait in a collective,
    and destroying an NCCL group then can hang instead of letting the launcher stop them all."""
    if "torch.distributed" not in sys.modules:  # a command that never loaded torch joined no group
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
