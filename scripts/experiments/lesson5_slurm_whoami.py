"""Lesson 5 experiment: who am I, when srun starts every process itself (no torchrun).

    sbatch scripts/lesson5_slurm_srun.sbatch                                 # on a cluster
    python -m ddpcourse.cluster.slurm run scripts/lesson5_slurm_srun.sbatch  # a throw-away one

srun tells each process who it is in its own variables. This script copies them into the
ones init_process_group's env:// method reads (the batch script sets MASTER_ADDR and
MASTER_PORT), joins the group, and has rank 0 print every process once, in rank order, as
scripts/lesson1_whoami.py does. Started by torchrun instead (scripts/lesson5_slurm.sbatch),
it uses torchrun's variables, which are already the right ones.
"""

import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import fail, world_of_one_unless_launched

# srun's name for each thing init_process_group and the lessons need.
FROM_SRUN = {
    "RANK": "SLURM_PROCID",        # global rank, 0 .. WORLD_SIZE-1
    "LOCAL_RANK": "SLURM_LOCALID",  # rank among the processes of this node
    "WORLD_SIZE": "SLURM_NTASKS",  # processes in the whole job
    "GROUP_RANK": "SLURM_NODEID",  # node rank (torchrun's name for it)
}


def main():
    # Started by srun? Copy its variables into the ones torchrun would have set. First thing:
    # even a mistake in the arguments is reported by RANK 0 alone.
    launcher = "torchrun" if "RANK" in os.environ else "srun"
    if launcher == "srun" and "SLURM_STEP_ID" in os.environ:  # a step srun started
        for ours, srun in FROM_SRUN.items():
            os.environ[ours] = os.environ[srun]
    elif launcher == "srun" and "SLURM_JOB_ID" in os.environ:  # the batch script's own shell
        fail("this runs in the batch script itself, as one process: put srun in front of it "
             "(see scripts/lesson5_slurm_srun.sbatch)")

    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective may wait before the job fails")
    args = parser.parse_args()
    started = time.perf_counter()

    if not world_of_one_unless_launched("sbatch scripts/lesson5_slurm_srun.sbatch  (or: "
                                        "python -m ddpcourse.cluster.slurm run "
                                        "scripts/lesson5_slurm_srun.sbatch)"):
        launcher = "none"
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        fail("MASTER_ADDR and MASTER_PORT are not set: the batch script sets them "
             "(see scripts/lesson5_slurm_srun.sbatch)")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    node_rank = int(os.environ["GROUP_RANK"])

    # env:// : rank 0 opens a store at MASTER_ADDR:MASTER_PORT, the others connect to it.
    # Always gloo and the CPU here: this script is about who is where, not about devices.
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=args.timeout))

    host = socket.gethostname()
    report = {
        "rank": dist.get_rank(),
        "node": node_rank,
        "local rank": local_rank,
        "world size": dist.get_world_size(),
        "host": host,
        "address": socket.gethostbyname(host),  # where this node is reached
        "launcher": launcher,
        "pid": os.getpid(),
    }
    reports = [None] * world_size if rank == 0 else None
    dist.gather_object(report, reports, dst=0)

    if rank == 0:
        print(format_table(reports), flush=True)
        # srun writes the processes per node compactly (SLURM_TASKS_PER_NODE="2(x3),1");
        # the reports say it plainly. srun hands out ranks node by node (block distribution).
        nodes = sorted({r["node"] for r in reports})
        per_node = [sum(r["node"] == n for r in reports) for n in nodes]
        first = {n: min(r["rank"] for r in reports if r["node"] == n) for n in nodes}
        holds = all(r["rank"] == first[r["node"]] + r["local rank"] for r in reports)
        print(f"check: global rank = first rank of its node + local rank "
              f"{'holds' if holds else 'DOES NOT hold'} for all {world_size} processes")
        print(summary_line(world_size=world_size, nodes=len(nodes),
                           per_node=",".join(map(str, per_node)),
                           hosts=len({r["address"] for r in reports}), launcher=launcher,
                           torch=torch.__version__.split("+")[0],
                           wall_s=round(time.perf_counter() - started, 2)))

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
