"""Lesson 6 experiment: find the rank that holds up a stuck job, from every rank's own stack.

    make lesson6-stuck NPROC=3       # prints, then runs, this command:
    torchrun --nproc-per-node=3 scripts/experiments/lesson6_stuck.py

Rank 1 "forgets" one all-reduce (it sleeps instead), so the others wait in theirs. Before the
collective timeout ends the job, a watchdog on every rank (faulthandler) prints where each
rank's Python is, and the flight recorder (TORCH_FR_BUFFER_SIZE) prints the last
collectives each rank entered, with their sequence numbers: the rank one number behind is
the one to look at. On a real hung job you get the same stacks with `kill -USR1 PID` (every
rank registers that signal here) or `py-spy dump --pid PID`, without stopping anything.
"""

import faulthandler
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse.cli import ArgumentParser
from ddpcourse.runtime import world_of_one_unless_launched
from ddpcourse.traces import flight_recorder


def last_collectives(count=3):
    """This rank's last collectives from the flight recorder, oldest first."""
    return [f"#{e['collective_seq_id']} {e['profiling_name']}" for e in flight_recorder()][-count:]


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stuck-rank", type=int, default=1)
    parser.add_argument("--watchdog", type=float, default=3, help="seconds before the stacks")
    parser.add_argument("--timeout", type=float, default=8,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    world_of_one_unless_launched()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not 0 <= args.stuck_rank < world_size or world_size < 2:
        parser.error(f"--stuck-rank {args.stuck_rank} in a world of {world_size}: a stuck rank "
                     "needs another rank to wait for it (start 2 or more processes)")
    # The flight recorder keeps this many collectives per rank; read when the group is made.
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    # `kill -USR1 <pid>` prints this rank's Python stack, at any time, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=False)

    value = torch.ones(1)
    for _ in range(3):
        dist.all_reduce(value)  # every rank, every step
    if rank == 0:
        print(f"3 all-reduces done on all {world_size} ranks; now rank {args.stuck_rank} "
              "skips the 4th", flush=True)
    # The watchdog: if this rank is still here after --watchdog seconds, print its stack
    # (a little later on each rank, so that the stacks do not interleave).
    faulthandler.dump_traceback_later(args.watchdog + 0.4 * rank, exit=False)
    started = time.monotonic()
    if rank == args.stuck_rank:
        while time.monotonic() - started < args.watchdog + 0.4 * world_size:
            time.sleep(0.1)  # the bug: a rank busy elsewhere (a slow file, a lock, a loop)
        print(f"rank {rank} flight recorder: {', '.join(last_collectives())}", flush=True)
        time.sleep(args.timeout)
    else:
        try:
            dist.all_reduce(value)  # waits for the rank that never comes
        except RuntimeError as error:
            print(f"rank {rank} flight recorder: {', '.join(last_collectives())}\n"
                  f"rank {rank} gave up after {time.monotonic() - started:.1f} s: "
                  f"{str(error).splitlines()[0][:120]}", flush=True)
            sys.exit(1)


if __name__ == "__main__":
    main()
