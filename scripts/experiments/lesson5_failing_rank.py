"""Lesson 5 experiment: one rank raises; per-rank logs and an error file say which, where, why.

    make lesson5-fail                       # this script through the course's launcher, then
    python scripts/experiments/lesson5_drills.py --only failing-rank   # with torchrun's logs:
    torchrun --nproc-per-node=2 --log-dir runs/lesson5_logs --redirects 3 --tee 3 \
        --local-ranks-filter 0 scripts/experiments/lesson5_failing_rank.py --fail-rank 1

It runs lesson 3's DDP training (scripts/lesson3_ddp.py, unchanged) with one bug planted: at
training step --fail-step, rank --fail-rank raises. `@record` on main writes that exception,
with its traceback, as JSON to the file torchrun names in TORCHELASTIC_ERROR_FILE, and
torchrun's report names it as the root cause: the first rank to fail, its host, its exit code,
its traceback. The other ranks were waiting for it in the gradient all-reduce; torchrun stops
them (SIGTERM) as soon as it sees the failure. Other options go to lesson3_ddp.py.

torchrun's options for the workers' output (torch 2.14, torch/distributed/run.py):
    --log-dir DIR               DIR/<run id>_<random>/attempt_<restart>/<local rank>/ holds
                                stdout.log, stderr.log and error.json, per node
    --redirects 3 (-r)          send each worker's stdout (1), stderr (2) or both (3) to those
                                files instead of the console; "0:3,1:2" sets local ranks apart
    --tee 3 (-t)                to the files and to the console, prefixed [default<local rank>]:
    --local-ranks-filter 0,1    the console shows only these local ranks; the files keep all
"""

import os
import runpy
import socket
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse.cli import ArgumentParser

STEP = Path(__file__).resolve().parents[1] / "lesson3_ddp.py"


def plant_failure(fail_rank: int, fail_step: int) -> None:
    """Every training step of lesson 3 calls its DDP model once: count them in a global
    forward pre-hook (torch.nn's documented hook for every module), and raise on one rank."""
    rank, host, steps = int(os.environ["RANK"]), socket.gethostname(), 0

    def before_forward(module, inputs):
        nonlocal steps
        if not isinstance(module, DDP):  # the layers inside, or validation's plain model
            return
        steps += 1
        print(f"rank {rank}: step {steps}", flush=True)  # into this rank's own log file
        if rank == fail_rank and steps == fail_step:
            # The bug this experiment plants: this rank meets a batch it cannot handle.
            raise RuntimeError(f"rank {rank} on {host} cannot train step {steps}: planted "
                               "failure (--fail-rank)")

    register_module_forward_pre_hook(before_forward)


@record  # an exception escaping main() is written to TORCHELASTIC_ERROR_FILE, then re-raised
def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fail-rank", type=int, default=1,
                        help="the global rank that raises (default 1; -1: none does)")
    parser.add_argument("--fail-step", type=int, default=2, help="at which step (default 2)")
    args, step_args = parser.parse_known_args()
    if args.fail_step < 1:
        parser.error("--fail-step must be at least 1")
    if "RANK" not in os.environ:
        parser.error("start it with torchrun: make lesson5-fail")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0:
        print(f"{world_size} ranks; " + (
            f"rank {args.fail_rank} will raise at training step {args.fail_step}"
            if 0 <= args.fail_rank < world_size else
            f"no rank will raise (--fail-rank {args.fail_rank} is not one of 0..{world_size - 1})"),
            flush=True)
    # Each rank says where its error file is: torchrun names one per rank.
    print(f"rank {rank} (pid {os.getpid()}): error file "
          f"{os.environ.get('TORCHELASTIC_ERROR_FILE') or '(none: not started by torchrun)'}",
          flush=True)
    plant_failure(args.fail_rank, args.fail_step)
    # Lesson 3's own options, for its own parser; a --checkpoint given comes later and wins.
    sys.argv = [str(STEP), "--checkpoint", "runs/lesson5_failing_rank.pt", *step_args]
    runpy.run_path(str(STEP), run_name="__main__")  # the step itself, not a copy of it


if __name__ == "__main__":
    main()
