"""Lesson 1: who am I? Every process says where it runs; rank 0 prints it once, in rank order.

    make lesson1 NPROC=4              # prints, then runs, the torchrun command below
    torchrun --nnodes=1 --nproc-per-node=4 --master-addr=127.0.0.1 --master-port=29500 \
        scripts/lesson1_whoami.py
    make lesson1 NNODES=2 NPROC=2     # two simulated nodes: two torchrun agents on this machine
"""

import os
import socket
import time
from datetime import timedelta

os.environ.setdefault("MPLBACKEND", "Agg")  # draw to a file; no screen needed

import torch
import torch.distributed as dist

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import pick_device, world_of_one_unless_launched
from ddpcourse.topology import Process, draw


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--picture", default="runs/lesson1_job.png",
                        help="where rank 0 saves the diagram of this job")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective may wait before the job fails")
    args = parser.parse_args()
    started = time.perf_counter()

    world_of_one_unless_launched()

    # torchrun tells each process who it is through environment variables.
    rank = int(os.environ["RANK"])                          # global rank, 0 .. WORLD_SIZE-1
    local_rank = int(os.environ["LOCAL_RANK"])              # rank among the processes of this node
    world_size = int(os.environ["WORLD_SIZE"])              # processes in the whole job
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])  # processes on this node
    node_rank = int(os.environ["GROUP_RANK"])               # torchrun's name for the node rank

    # One GPU per process when there are GPUs (nccl), otherwise the CPU (gloo).
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    report = {
        "rank": dist.get_rank(),
        "node": node_rank,
        "local rank": local_rank,
        "world size": dist.get_world_size(),
        "local world size": local_world_size,
        "host": socket.gethostname(),
        "device": str(device),
        "backend": dist.get_backend(),
        "pid": os.getpid(),
    }
    # Every process sends its report to rank 0, which receives them in rank order.
    reports = [None] * world_size if rank == 0 else None
    dist.gather_object(report, reports, dst=0)

    if rank == 0:
        print(format_table(reports), flush=True)
        rule_holds = all(r["rank"] == r["node"] * local_world_size + r["local rank"]
                         for r in reports)
        print(f"check: global rank = node x processes per node + local rank "
              f"{'holds' if rule_holds else 'DOES NOT hold'} for all {world_size} processes")
        processes = [
            Process(r["rank"], r["node"], r["local rank"],
                    gpus=(torch.device(r["device"]).index,) if "cuda" in r["device"] else (),
                    label=f"pid {r['pid']}")
            for r in reports
        ]
        nodes = len({r["node"] for r in reports})
        fig = draw(processes, title=f"the job that ran: {nodes} node(s), world size {world_size}, "
                                    f"{dist.get_backend()}")
        os.makedirs(os.path.dirname(args.picture) or ".", exist_ok=True)
        fig.savefig(args.picture, dpi=120)
        print(f"picture of this job: {args.picture}")
        print(summary_line(world_size=world_size, nodes=nodes, backend=dist.get_backend(),
                           wall_s=round(time.perf_counter() - started, 2)))

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
