"""Lesson 7 experiment: no_sync accumulation checked: equal to the big batch, K times less sent.

    make lesson7-accumulate NPROC=2                     # runs the step, then this command:
    torchrun --nproc-per-node=2 scripts/experiments/lesson7_accumulate_check.py

The step scripts/lesson7_accumulate.py trains with K micro-batches per step. This check
does what lesson3_check_equivalence.py does for DDP (a comparison with one process on the
whole batch) for accumulation. Each rank trains the same starting model three ways on the
same samples:

    big batch   one forward/backward of K x micro-batch samples per step
    no_sync     K micro-batches; the first K - 1 forward and backward passes in no_sync()
    every pass  K micro-batches, every backward all-reduced (no no_sync)

A communication hook counts DDP's all-reduces and the values they carry. Rank 0 then
trains a copy alone on every rank's samples together and prints how far each way lands
from it: all three agree to float rounding, and no_sync sends K times less.
"""

import copy
import os
import sys
import time
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DistributedSampler

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched
from ddpcourse.scripts import import_script

flat = import_script("lesson3_check_equivalence", "flat")  # lesson 3's comparison


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="test_vit",
                        help="a timm model without BatchNorm or dropout: the ways must match")
    parser.add_argument("--accumulation", type=int, default=4,
                        help="K: micro-batches per optimizer step")
    parser.add_argument("--micro-batch", type=int, default=8,
                        help="samples per micro-batch per process")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps to compare")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if min(args.accumulation, args.micro_batch, args.steps) < 1:
        parser.error("--accumulation, --micro-batch and --steps must be at least 1")
    return args


def counting_hook(counts, bucket):
    """DDP's own all-reduce (default_hooks.allreduce_hook), counted on the way."""
    counts["all-reduces"] += 1
    counts["values"] += bucket.buffer().numel()
    return default_hooks.allreduce_hook(None, bucket)


def train(model, steps, lr, device, accumulation=1, use_no_sync=True):
    """SGD over `steps`, each a list of K micro-batches (images, labels)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    seconds = []
    for micro_batches in steps:
        tick = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for k, (images, labels) in enumerate(micro_batches):
            last = k == len(micro_batches) - 1
            # Inside no_sync() backward only adds into p.grad; the last backward, outside
            # it, all-reduces the sum of all K. Without no_sync every backward all-reduces.
            quiet = model.no_sync() if use_no_sync and not last else nullcontext()
            with quiet:
                loss = F.cross_entropy(model(images.to(device)), labels.to(device))
                (loss / accumulation).backward()  # the mean over K micro-batches
        optimizer.step()
        seconds.append(time.perf_counter() - tick)
        if hasattr(model, "counts"):  # this step's all-reduces, for the table
            model.counts["per step"].append(model.counts["all-reduces"]
                                            - sum(model.counts["per step"]))
    return seconds


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])

    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # Exact arithmetic on GPUs too: no TF32 shortcuts, no nondeterministic kernels.
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    K, micro = args.accumulation, args.micro_batch
    per_step = K * micro  # this rank's samples per optimizer step
    train_set, _ = load_datasets("digits")
    if args.steps * per_step * world_size > len(train_set):
        fail(f"{args.steps} steps of {world_size} x {K} x {micro} samples need more than the "
             f"{len(train_set)} training images; take fewer steps or smaller batches")
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    mine = list(BatchSampler(sampler, per_step, drop_last=True))[:args.steps]
    shares = [None] * world_size if rank == 0 else None
    dist.gather_object(mine, shares, dst=0)  # rank 0 learns every rank's samples

    def batch(indices):
        images, labels = zip(*(train_set[i] for i in indices), strict=True)
        return torch.stack(images), torch.stack(labels)

    big = [[batch(step)] for step in mine]                      # one batch of K x micro
    small = [[batch(step[k * micro:(k + 1) * micro]) for k in range(K)] for step in mine]

    torch.manual_seed(args.seed)
    start_model = create_model(args.model, NUM_CLASSES["digits"]).to(device)
    rows, finals = [], {}
    for way, steps, accumulation, use_no_sync in [("big batch", big, 1, True),
                                                  ("no_sync", small, K, True),
                                                  ("every pass", small, K, False)]:
        model = DDP(copy.deepcopy(start_model),
                    device_ids=[local_rank] if device.type == "cuda" else None)
        model.counts = counts = {"all-reduces": 0, "values": 0, "per step": []}
        model.register_comm_hook(counts, counting_hook)
        seconds = train(model, steps, args.lr, device, accumulation, use_no_sync)
        finals[way] = flat(model.module)
        # DDP sends one bucket in the first step and rebuilds its buckets after it (lesson 6):
        # the last step shows the steady state.
        rows.append({"way": way, "backward/step": len(steps[0]),
                     "all-reduces/step": counts["per step"][-1],
                     "values sent/step": counts["values"] // args.steps,
                     "ms/step": f"{1e3 * sorted(seconds)[len(seconds) // 2]:.1f}"})

    # Rank 0 trains alone on every rank's samples of each step together: the reference.
    gathered = {way: [torch.empty_like(f) for _ in range(world_size)] if rank == 0 else None
                for way, f in finals.items()}
    for way, final in finals.items():
        dist.gather(final, gathered[way], dst=0)
    if rank == 0:
        alone = copy.deepcopy(start_model)
        whole = [[batch(sum((share[s] for share in shares), []))] for s in range(args.steps)]
        train(alone, whole, args.lr, device)
        reference = flat(alone)
        for row in rows:
            copies = gathered[row["way"]]
            row["max |diff| vs one process"] = \
                f"{max((c - reference).abs().max().item() for c in copies):.1e}"
            row["ranks agree"] = "yes" if all(torch.equal(c, copies[0]) for c in copies) else "NO"
        print(f"{args.model}, {world_size} process(es), K = {K} micro-batches of {micro} "
              f"per process: a global batch of {world_size * per_step}, {args.steps} steps, "
              f"{device.type}/{backend}")
        print(format_table(rows))
        by_way = {row["way"]: row for row in rows}
        ratio = by_way["every pass"]["values sent/step"] / by_way["no_sync"]["values sent/step"]
        worst = max(float(row["max |diff| vs one process"]) for row in rows)
        passed = worst <= args.tolerance and all(row["ranks agree"] == "yes" for row in rows)
        verdict = "matches" if passed else "DOES NOT match"
        print(f"check: no_sync sends {ratio:g} times less than every pass (K = {K}, "
              f"{by_way['no_sync']['all-reduces/step']} against "
              f"{by_way['every pass']['all-reduces/step']} all-reduces a step); every way "
              f"{verdict} one process "
              f"on the big batch within {args.tolerance:g}")
        print(summary_line(world_size=world_size, accumulation=K, micro_batch=micro,
                           allreduces_no_sync=by_way["no_sync"]["all-reduces/step"],
                           allreduces_every_pass=by_way["every pass"]["all-reduces/step"],
                           max_diff=f"{worst:.1e}", equivalent="yes" if passed else "no",
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()
    if rank == 0 and not passed:
        sys.exit(1)


if __name__ == "__main__":
    main()
