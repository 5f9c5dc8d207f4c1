"""Lesson 5: one rank raises; per-rank logs and an error file say which one, where and why.

    make lesson5-fail                       # this script through the course's launcher, then
    python scripts/lesson5_drills.py --only failing-rank     # the same with torchrun's logs:
    torchrun --nproc-per-node=2 --log-dir runs/lesson5_logs --redirects 3 --tee 3 \
        --local-ranks-filter 0 scripts/lesson5_failing_rank.py --fail-rank 1

A few DDP steps of a small model; at --fail-step, rank --fail-rank raises. `@record` on main
writes that exception, with its traceback, as JSON to the file torchrun names in
TORCHELASTIC_ERROR_FILE, and torchrun's report names it as the root cause: the first rank to
fail, its host, its exit code, its traceback. The other ranks were waiting for it in the
gradient all-reduce; torchrun stops them (SIGTERM) as soon as it sees the failure.

torchrun's options for the workers' output (torch 2.14, torch/distributed/run.py):
    --log-dir DIR               DIR/<run id>_<random>/attempt_<restart>/<local rank>/ holds
                                stdout.log, stderr.log and error.json, per node
    --redirects 3 (-r)          send each worker's stdout (1), stderr (2) or both (3) to those
                                files instead of the console; "0:3,1:2" sets local ranks apart
    --tee 3 (-t)                to the files and to the console, prefixed [default<local rank>]:
    --local-ranks-filter 0,1    the console shows only these local ranks; the files keep all
"""

import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import load_datasets
from ddpcourse.report import summary_line
from ddpcourse.runtime import pick_device, world_of_one_unless_launched


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fail-rank", type=int, default=1,
                        help="the global rank that raises (default 1; -1: none does)")
    parser.add_argument("--fail-step", type=int, default=2, help="at which step (default 2)")
    parser.add_argument("--steps", type=int, default=4, help="steps to train (default 4)")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.steps < 1 or args.fail_step < 1 or args.timeout <= 0:
        parser.error("--steps and --fail-step must be at least 1, --timeout positive")
    return args


@record  # an exception escaping main() is written to TORCHELASTIC_ERROR_FILE, then re-raised
def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched("make lesson5-fail  (or: torchrun --nproc-per-node=3 "
                                 "scripts/lesson5_failing_rank.py --fail-rank 1)")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    host = socket.gethostname()

    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    if rank == 0:
        doomed = args.fail_rank if 0 <= args.fail_rank < world_size else None
        print(f"{world_size} ranks; " + (f"rank {doomed} will raise at step {args.fail_step}"
              if doomed is not None else f"no rank will raise (--fail-rank {args.fail_rank} "
              f"is not one of 0..{world_size - 1})"), flush=True)
    # Each rank says where its output goes: with --redirects, into its own log file.
    print(f"rank {rank} (local rank {local_rank}, host {host}, pid {os.getpid()}): error file "
          f"{os.environ.get('TORCHELASTIC_ERROR_FILE') or '(none: not started by torchrun)'}",
          flush=True)

    train_set, _ = load_datasets("digits")
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=0)
    loader = DataLoader(train_set, batch_size=max(1, 128 // world_size), sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10)).to(device),
                device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)

    step = 0
    while step < args.steps:
        for images, labels in loader:
            step += 1
            if rank == args.fail_rank and step == args.fail_step:
                # The bug this drill plants: this rank meets a batch it cannot handle.
                raise RuntimeError(f"rank {rank} on {host} cannot train step {step}: "
                                   "planted failure (--fail-rank)")
            loss = F.cross_entropy(model(images.to(device)), labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # the all-reduce of the gradients: every rank must take part
            optimizer.step()
            print(f"rank {rank}: step {step} loss {loss.item():.4f}", flush=True)
            if step == args.steps:
                break
    if rank == 0:
        print(summary_line(world_size=world_size, steps=step, failed_rank="none",
                           wall_s=round(time.perf_counter() - started, 2)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
