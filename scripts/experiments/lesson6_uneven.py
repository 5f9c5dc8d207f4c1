"""Lesson 6 experiment: ranks with different numbers of batches; the hang, then the fix (Join).

    make lesson6-uneven NPROC=3      # runs these (and two timings), printing each command:
    torchrun --nproc-per-node=3 scripts/experiments/lesson6_uneven.py --timeout 5   # hangs
    torchrun --nproc-per-node=3 scripts/experiments/lesson6_uneven.py --join        # finishes
    torchrun --nproc-per-node=3 scripts/experiments/lesson6_uneven.py --join \
        --divide-by-ranks-with-data

Rank r gets `--batches` + r batches. DDP all-reduces the gradients in every backward(), and an
all-reduce needs every rank: when rank 0 has run out of data, the others wait in their next
backward for a partner that never comes, until the collective timeout ends the job.

With `Join([model])` a rank that has run out keeps answering: each time the others
all-reduce, it joins in with zeros ("shadows" the collective), so they finish their extra
batches. The sum of the gradients is then divided by the world size the job started with
(Join's default, divide_by_initial_world_size=True), or, with --divide-by-ranks-with-data
(False), by the ranks that still had a batch. The last rank's last step shows which: it alone
had data, and this script compares DDP's gradient with the rank's own.
"""

import copy
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse.cli import ArgumentParser
from ddpcourse.runtime import world_of_one_unless_launched


def main():
    # No option may be the start of two of torchrun's (--even is: --event-log-handler and
    # --event_log_handler): torchrun refuses such a prefix even after the script's name.
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20, help="rank r gets this + r batches")
    parser.add_argument("--join", action="store_true", help="wrap the loop in Join([model])")
    parser.add_argument("--divide-by-ranks-with-data", action="store_true",
                        help="Join(..., divide_by_initial_world_size=False)")
    parser.add_argument("--equal-batches", action="store_true",
                        help="every rank gets --batches: what Join costs when none ends early")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.batches < 1:
        parser.error("--batches must be >= 1")
    world_of_one_unless_launched()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    extra = 0 if args.equal_batches else 1  # rank r gets r more batches: uneven on purpose
    mine = args.batches + extra * rank
    most = args.batches + extra * (world_size - 1)
    batches = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(mine)]
    if rank == 0:
        print(f"{world_size} ranks with {args.batches}..{most} batches each; "
              f"{'with' if args.join else 'without'} Join"
              + (", divide_by_initial_world_size=False" if args.divide_by_ranks_with_data
                 else ""), flush=True)

    divisor = None
    tick = time.perf_counter()
    # enable=False: the plain loop, to see the hang. The keyword reaches DDP's join hook.
    with Join([model], enable=args.join,
              divide_by_initial_world_size=not args.divide_by_ranks_with_data):
        for i, (inputs, labels) in enumerate(batches):
            alone = mine == most > args.batches and i == mine - 1  # the others ran out
            if alone:  # the same weights without DDP: this rank's own gradient
                own = copy.deepcopy(model.module)
                F.cross_entropy(own(inputs), labels).backward()
            loss = F.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()  # the all-reduce that needs every rank
            if alone:
                divisor = (own.weight.grad.norm() / model.module.weight.grad.norm()).item()
            optimizer.step()
    seconds = time.perf_counter() - tick
    # Every rank ends with the same weights: the shadows kept the all-reduces in step.
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    copies = [torch.empty_like(weights) for _ in range(world_size)]
    dist.all_gather(copies, weights)
    line = (f"rank {rank}: {mine} batches of its own, {most - mine} shadowed step(s), "
            f"{seconds:.2f} s")
    if divisor is not None:
        line += (f"; its last step, the only rank with data: DDP's gradient = its own / "
                 f"{divisor:.2f}")
    lines = [None] * world_size if rank == 0 else None
    dist.gather_object(line, lines, dst=0)  # printed once, in rank order
    if rank == 0:
        print("\n".join(lines))
        same = all(torch.equal(copies[0], c) for c in copies)
        print(f"summary: world_size={world_size} join={args.join} "
              f"weights_equal_on_all_ranks={same} wall_s={seconds:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
