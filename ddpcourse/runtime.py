"""The machine-dependent choices every script makes the same way."""

from __future__ import annotations

import os
import re
import sys
from typing import NoReturn

# DDP imports torch.distributed.nn, whose functions take `group=group.WORLD` as a default
# argument, bound when the module is first imported. Imported after init_process_group, it
# keeps the world group alive past destroy_process_group, and gloo's worker threads with it;
# they may then free a collective's tensors while Python shuts down, which aborts the process
# ("terminate called without an active exception", about 1 run in 20 here). Imported now,
# before any group exists, it binds None, and destroy_process_group really ends the group.
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401

from ddpcourse.cli import exit_after_rank_0
from ddpcourse.ports import free_port


def pick_device(local_rank: int = 0):
    """(device, backend) from the hardware: a GPU per process with nccl, else the CPU with gloo."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def launch_hint(script: str, doc: str | None) -> str:
    """How to start `script` on several processes, from the `make ...` line its docstring
    shows first: `make lesson7-amp NPROC=2  (or: torchrun --nproc-per-node=2 SCRIPT)`. A
    docstring without one gives the torchrun command alone (NPROC x NNODES processes on one
    node; the Makefile's NPROC is 2)."""
    make = next((line.split("#")[0].strip() for line in (doc or "").splitlines()
                 if line.strip().startswith("make ")), "")
    count = {name: int(n) for name, n in re.findall(r"\b(NPROC|NNODES)=(\d+)", make)}
    torchrun = (f"torchrun --nproc-per-node={count.get('NPROC', 2) * count.get('NNODES', 1)} "
                f"{script}")
    return f"{make}  (or: {torchrun})" if make else torchrun


def world_of_one_unless_launched(how_to_launch: str | None = None) -> bool:
    """Started without torchrun? Say how to launch properly, then fill in a world of one.

    Returns True when the script was started by a launcher. torchrun sets RANK,
    LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT;
    without them init_process_group("env://") would fail, so we provide a world of one.
    How to launch it is the running script's own (launch_hint), unless `how_to_launch`
    says otherwise (a script that srun starts, not torchrun).
    """
    if "RANK" in os.environ:
        return True
    if how_to_launch is None:
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", None) or "SCRIPT.py"  # none: python -c, a notebook
        shown = os.path.relpath(script)  # as typed from the course folder, where it is inside
        how_to_launch = launch_hint(script if shown.startswith(os.pardir) else shown,
                                    getattr(main, "__doc__", None))
    print(
        f"note: not started by torchrun, so this runs as a world of one process. "
        f"To start several: {how_to_launch}",
        file=sys.stderr,
        flush=True,
    )
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    return False


def needs_library(name: str, setup: str) -> None:
    """Stop with one line, not an ImportError's traceback, where a library a lesson adds to
    .venv on first use (`setup`: the make target that adds it) is not installed yet."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        sys.exit(f"error: {name} is not installed here: `{setup}` adds it to .venv")


def fail(message: str) -> NoReturn:
    """Stop with a one-line `error: ...` and exit status 1, instead of a traceback.

    A problem that all ranks meet, such as a missing dataset, is reported once, by rank 0
    (see ddpcourse.cli.exit_after_rank_0).
    """
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else None
    exit_after_rank_0(f"error: {message}", 1, rank)


def end_with_rank_0s_verdict(failed: bool, device) -> None:
    """End an experiment's job with rank 0's verdict on every rank: rank 0 compared the run
    with its prediction, and if it `failed`, every rank exits with status 1 (so torchrun, make
    and the tests see the failure); the default process group is destroyed either way."""
    status = torch.tensor([int(bool(failed))], dtype=torch.int32, device=device)
    dist.broadcast(status, src=0)
    dist.destroy_process_group()
    if status.item():
        raise SystemExit(1)
