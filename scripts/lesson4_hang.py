"""Lesson 4 failure drill: the ranks disagree on a collective, and the timeout ends the wait.

    make lesson4-hang                  # broken, broken under DETAIL checks, then fixed
    torchrun --nproc-per-node=2 scripts/lesson4_hang.py --timeout 5          # broken
    torchrun --nproc-per-node=2 scripts/lesson4_hang.py --timeout 5 --detail # names the mismatch
    torchrun --nproc-per-node=2 scripts/lesson4_hang.py --timeout 5 --fixed  # every rank joins

A small training loop logs the mean loss. The bug: only rank 0 calls all_reduce (it is the
rank that prints, so someone put the whole block under `if rank == 0`). The other ranks go
on and wait in the final barrier, which rank 0 never reaches: every rank waits for a partner
that is not coming. Without a timeout that is a silent hang; with `timeout=` on the process
group, gloo raises on each waiting rank after that many seconds and the job ends. (On GPUs,
nccl's watchdog aborts the stuck processes after the timeout instead, with a message naming
the collective and its sequence number.)
"""

import os
import re
import time
from datetime import timedelta

from ddpcourse.cli import ArgumentParser

parser = ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--timeout", type=float, default=5,
                    help="seconds a collective may wait before it fails (default 5)")
parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
parser.add_argument("--fixed", action="store_true", help="every rank joins the all_reduce")
parser.add_argument("--detail", action="store_true",
                    help="run with TORCH_DISTRIBUTED_DEBUG=DETAIL (checks every collective)")
args = parser.parse_args()
if args.timeout <= 0:
    parser.error("--timeout must be a positive number of seconds")
if args.steps < 1:
    parser.error("--steps must be at least 1")
if args.detail:
    # Read when the process group is created: each collective first compares its
    # "fingerprint" (op, shapes, dtypes) across ranks and fails at once on a mismatch.
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"

import torch
import torch.distributed as dist

from ddpcourse.report import summary_line
from ddpcourse.runtime import pick_device, world_of_one_unless_launched


def explain(error: Exception, rank: int, op: str, waited: float) -> str:
    """One line on what went wrong, from the exception a stuck collective raised."""
    text = str(error)
    mine = re.search(rf"Rank {rank} is running collective: CollectiveFingerPrint\("
                     r"SequenceNumber=(\d+),? ?OpType=(\w+)", text)
    if "Detected mismatch between collectives" in text and mine:
        seq, kind = mine.groups()
        return (f"rank {rank}: TORCH_DISTRIBUTED_DEBUG=DETAIL found the mismatch after "
                f"{waited:.2f} s: collective #{seq} is {kind.lower()} here, and not on "
                "every other rank")
    if "Timed out" in text or waited >= 0.9 * args.timeout:
        who = "the other ranks never joined it" if op == "all_reduce" else \
              "some rank never arrived"
        return f"rank {rank} waited {waited:.0f} s in {op}: {who}"
    first = " ".join(text.split())[:160]
    return f"rank {rank} gave up in {op} after {waited:.1f} s: {first}"


def main():
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    device, backend = pick_device(int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # device_id binds the group to this GPU, so nccl's barrier knows which one to use.
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout),
                            device_id=device if device.type == "cuda" else None)
    world = dist.get_world_size()
    if rank == 0:
        print(f"{world} ranks, backend {backend}, process-group timeout {args.timeout:g} s, "
              f"{'fixed' if args.fixed else 'broken'} version"
              + (", TORCH_DISTRIBUTED_DEBUG=DETAIL" if args.detail else ""), flush=True)
        if world == 1:
            print("note: with one process no rank can be missing; run it with NPROC=2")

    op, op_started = None, time.perf_counter()
    try:
        for step in range(args.steps):
            loss = torch.tensor([1.0 / (step + 1) + 0.1 * rank], device=device)  # "training"
            time.sleep(0.05)
            # Log the mean loss. BROKEN: only rank 0 joins the all_reduce. FIXED: everyone
            # joins it, and only the printing stays with rank 0.
            if args.fixed or rank == 0:
                op, op_started = "all_reduce", time.perf_counter()
                total = loss.clone()
                dist.all_reduce(total)
                if rank == 0:
                    print(f"step {step}: mean loss {total.item() / world:.4f}", flush=True)
        op, op_started = "barrier", time.perf_counter()
        dist.barrier()  # everyone finishes together (saving a checkpoint would go here)
    except RuntimeError as error:
        waited = time.perf_counter() - op_started
        # Every rank fails at the same moment: one write per line keeps the lines whole.
        print(explain(error, rank, op, waited) + "\n", end="", flush=True)
        if rank == 0:
            print(summary_line(world_size=world, fixed=args.fixed, outcome="failed", op=op,
                               waited_s=round(waited, 2),
                               wall_s=round(time.perf_counter() - started, 2)), flush=True)
        dist.destroy_process_group()
        raise SystemExit("error: the ranks did not call the same collectives; see the lines "
                         "above" if rank == 0 else 1) from None

    if rank == 0:
        print(summary_line(world_size=world, fixed=args.fixed, outcome="finished",
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
