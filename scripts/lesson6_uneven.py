"""Lesson 6 drill: ranks with different numbers of batches; the hang, then the fix (Join).

    make lesson6-uneven NPROC=3      # runs both, printing each command:
    torchrun --nproc-per-node=3 scripts/lesson6_uneven.py --timeout 5          # hangs, then fails
    torchrun --nproc-per-node=3 scripts/lesson6_uneven.py --join               # finishes

Rank r gets `--batches` + r batches. DDP all-reduces the gradients in every backward(), and an
all-reduce needs every rank: when rank 0 has run out of data, the others wait in their next
backward for a partner that never comes, until the collective timeout ends the job.

With `Join([model])` a rank that has run out keeps answering: each time the others
all-reduce, it joins in with zeros ("shadows" the collective), so they finish their extra
batches, and the averages divide by the ranks that really had data.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse.cli import ArgumentParser
from ddpcourse.runtime import world_of_one_unless_launched


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20, help="rank r gets this + r batches")
    parser.add_argument("--join", action="store_true", help="wrap the loop in Join([model])")
    parser.add_argument("--equal-batches", action="store_true",
                        help="every rank gets --batches: what Join costs when none ends early")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    world_of_one_unless_launched("make lesson6-uneven NPROC=3")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    extra = 0 if args.equal_batches else 1  # rank r gets r more batches: uneven on purpose
    mine = args.batches + extra * rank
    batches = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(mine)]
    if rank == 0:
        most = args.batches + extra * (world_size - 1)
        print(f"{world_size} ranks with {args.batches}..{most} batches each; "
              f"{'with' if args.join else 'without'} Join", flush=True)

    tick = time.perf_counter()
    with Join([model], enable=args.join):  # enable=False: the plain loop, to see the hang
        for inputs, labels in batches:
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()  # the all-reduce that needs every rank
            optimizer.step()
    seconds = time.perf_counter() - tick
    # Every rank ends with the same weights: the shadows kept the all-reduces in step.
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    copies = [torch.empty_like(weights) for _ in range(world_size)]
    dist.all_gather(copies, weights)
    line = (f"rank {rank}: {mine} batches of its own, "
            f"{args.batches + extra * (world_size - 1) - mine} shadowed all-reduce(s), "
            f"{seconds:.2f} s")
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
