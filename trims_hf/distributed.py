"""Data parallelism for evaluation, the harness model and scoring: who does which work, and one result from N.

Every multi-process command (``trims eval``, ``trims score``, the lm-evaluation-harness ``trims`` model) runs under
``accelerate launch`` or ``torchrun`` and goes through this module, so they agree on three things:

- the process group: :func:`process_state` is accelerate's :class:`~accelerate.PartialState`, asked for the CPU
  (gloo) when the work runs on the CPU. A plain ``PartialState()`` on a machine without CUDA reads a
  ``--multi_gpu`` (torchrun) launch as one process, and then every process would do all the work;
- the split: :func:`balanced_shards` (pure) deals weighted work units out so that every process gets about the
  same cost, and :func:`my_share` hands this process its shard through accelerate's ``split_between_processes``;
- the merge: :func:`gather` is accelerate's ``gather_object`` (every process gets the list, in process order).

:func:`announce` says how many processes a command runs on, and when the launch asked for more than it got (e.g.
``accelerate launch --cpu --num_processes 2`` starts ONE process: accelerate's multi-CPU mode needs mpirun), how to
get them.
"""

from __future__ import annotations

import heapq
import os
import sys
from collections.abc import Sequence
from typing import Any

from accelerate import PartialState
from accelerate.utils import gather_object

CPU_LAUNCH_ADVICE = ("on CPU, launch with `accelerate launch --multi_gpu --num_processes N ...` or `torchrun "
                     "--nproc_per_node N ...` (gloo processes; `--cpu` alone starts one unless mpirun is set up)")
"""How to get N processes on CPU: the launch that tests/test_distributed.py uses too."""


def name_cpu_accelerator() -> None:
    """Tell DeepSpeed that this process computes on the CPU (``DS_ACCELERATOR=cpu``, its own setting; one the user
    made wins). Why: accelerate imports DeepSpeed wherever it is installed (every Trainer asks it to unwrap the
    model), and DeepSpeed, left to detect its accelerator, prints on every CPU run that it is "unable to detect" a
    GPU and falls back to the CPU; named, it is the same CPU accelerator, without the line. Call it before the
    first Trainer (DeepSpeed reads the setting once, when it is first imported)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


def process_state(device: str | None = None) -> PartialState:
    """accelerate's process state, on the CPU (gloo) when ``device`` is a CPU or no CUDA device exists; the first
    call in a process decides (``PartialState`` is shared)."""
    import torch

    cpu = not torch.cuda.is_available() or (device is not None and torch.device(device).type == "cpu")
    return PartialState(cpu=cpu)


def balanced_shards(costs: Sequence[float], num_shards: int) -> list[list[int]]:
    """Indices of ``costs`` dealt into ``num_shards`` shards of near-equal total cost, each in ascending order.

    Longest first, each to the shard with the least cost so far (ties: the lower shard): the largest shard then
    exceeds the mean by at most the largest single cost, and the split is the same on every process and every
    run (a resumed run finds each unit where it left it).
    """
    if num_shards < 1:
        raise ValueError(f"num_shards={num_shards}: must be at least 1")
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    loads = [(0.0, shard) for shard in range(num_shards)]
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, shard = heapq.heappop(loads)
        shards[shard].append(index)
        heapq.heappush(loads, (load + costs[index], shard))
    return [sorted(shard) for shard in shards]


def my_share(costs: Sequence[float], state: PartialState) -> list[int]:
    """The indices of ``costs`` this process works on: its shard of :func:`balanced_shards`."""
    with state.split_between_processes(balanced_shards(costs, state.num_processes)) as shards:
        return shards[0]


def gather(value: Any) -> list[Any]:
    """``value`` of every process, in process order, on every process (one process: ``[value]``)."""
    return gather_object([value])


def requested_processes() -> int | None:
    """The process count the ``accelerate launch`` that started this process asked for (its ``--num_processes``
    or its config file's), or None when not started by ``accelerate launch``. Read from the launcher's command
    line with accelerate's own parser, because a ``--cpu`` launch passes no count to the process it starts."""
    import psutil
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    try:
        argv = psutil.Process().parent().cmdline()
    except (psutil.Error, AttributeError):
        return None
    starts = [i + 1 for i, arg in enumerate(argv) if arg == "launch" or arg.endswith("accelerate.commands.launch")]
    if not starts:
        return None
    try:
        args, _ = launch_command_parser().parse_known_args(argv[starts[0]:])
        if args.num_processes is None and args.config_file:
            return load_config_from_file(args.config_file).num_processes
    except (SystemExit, OSError, ValueError):
        return None
    return args.num_processes


def announce(command: str, state: PartialState) -> None:
    """Say (on the main process, on stderr) how many processes ``command`` runs on, under a launcher or on several,
    and how to get the count a launch asked for when it got fewer. A plain run on one process says nothing: its
    output stays the command's own (a mistake in the data one ``error:`` line)."""
    if not state.is_main_process:
        return
    asked = requested_processes()
    if state.num_processes == 1 and asked is None:
        return
    how = f"es ({state.distributed_type.value.lower()}, {state.backend})" if state.num_processes > 1 else ""
    print(f"{command}: running on {state.num_processes} process{how}", file=sys.stderr)
    if asked is not None and asked > state.num_processes:
        print(f"warning: the launch asked for {asked} processes and {command} got {state.num_processes}; "
              f"{CPU_LAUNCH_ADVICE}.", file=sys.stderr)


__all__ = ["announce", "balanced_shards", "gather", "my_share", "process_state", "requested_processes"]
