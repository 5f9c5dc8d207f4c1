"""Lesson 9: lesson 3's DDP training on the worker processes of a Dask cluster.

    python scripts/lesson9_dask.py --workers 2 -- --epochs 8

Dask is the launcher here, in place of torchrun. This process (the root) makes the cluster,
a scheduler and W worker processes (a LocalCluster, one machine: the task sets MASTER_ADDR
127.0.0.1 and LOCAL_RANK = RANK; on several machines, `dask scheduler` on one and `dask worker
ADDRESS` on every other, the task would have to set those per host), and is its one client.
It chooses the rendezvous address and port itself, then hands each worker one task: set what
torchrun would have set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and run
scripts/lesson3_ddp.py, unchanged, in that worker. Only the root makes a cluster; a second
process that did so would make a second cluster, with workers of its own.
"""

import logging
import os
import runpy
import sys
import time
from pathlib import Path

from ddpcourse.cli import ArgumentParser
from ddpcourse.ports import free_port
from ddpcourse.runtime import needs_library

needs_library("distributed", "make setup-lesson9")  # before importing it: one line
from distributed import Client, LocalCluster, as_completed

STEP = Path(__file__).resolve().parent / "lesson3_ddp.py"


def train_on_this_worker(rank: int, world_size: int, port: int, step_args: list[str]) -> int:
    """Runs in a Dask worker process, in its one task thread: lesson 3's step as rank `rank`,
    with the environment torchrun gives a worker (one node: LOCAL_RANK = RANK)."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.argv = [str(STEP), *step_args]
    try:
        runpy.run_path(str(STEP), run_name="__main__")
    except SystemExit as stop:  # the step stopped (a bad option): an error, not the worker's end
        if stop.code not in (None, 0):
            raise RuntimeError(f"rank {rank}: lesson3_ddp.py stopped: {stop.code}") from None
    return os.getpid()


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="Dask worker processes: W ranks")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for the whole run")
    parser.add_argument("step_args", nargs="*", help="after --: lesson3_ddp.py's options")
    args = parser.parse_args()
    if not 1 <= args.workers <= 16:
        parser.error("--workers must be 1 to 16")

    started = time.perf_counter()
    # One thread per worker: a task runs there, and torch's threads share the cores.
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None, env={"OMP_NUM_THREADS": "1"},
                      silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])  # their addresses
        port = free_port()  # the rendezvous: rank 0's worker opens the store on it
        print(f"Dask: scheduler {cluster.scheduler_address}, {len(workers)} worker "
              f"process(es); rank r on worker r, rendezvous at 127.0.0.1:{port}", flush=True)
        # One task per worker, pinned to it (workers=), run once (pure=False).
        tasks = [client.submit(train_on_this_worker, rank, len(workers), port, args.step_args,
                               workers=[address], pure=False, key=f"rank-{rank}")
                 for rank, address in enumerate(workers)]
        try:  # every rank's end, or the first failure: never a wait without an end
            for task in as_completed(tasks, timeout=args.timeout):
                task.result()  # raises the task's error as soon as it ends with one
            pids = client.gather(tasks)
        except TimeoutError:
            sys.exit(f"error: the ranks did not finish within {args.timeout:g} s")
        except RuntimeError as error:
            sys.exit(f"error: {error}")
        print(f"Dask: the ranks ran in worker processes {pids}; this process, the client, is "
              f"{os.getpid()}; {time.perf_counter() - started:.1f} s in all", flush=True)


if __name__ == "__main__":
    main()
