"""Lesson 7 experiment: SyncBatchNorm checked: lesson 3's BatchNorm row down to float rounding.

    make lesson7-syncbn NPROC=3                         # runs the step, then this command:
    torchrun --nproc-per-node=3 scripts/experiments/lesson7_sync_batchnorm_check.py

It is lesson3_check_equivalence.py's comparison for the model with BatchNorm, with one more
row: its BatchNorm layers replaced by CPUSyncBatchNorm from the step
scripts/lesson7_sync_batchnorm.py, whose statistics are summed over all ranks by the
exercise l7_sync_batchnorm (the reference solution when the course has it, else yours once
it is written: --impl). torch's nn.SyncBatchNorm refuses CPU tensors; on GPUs it gets its own row,
and the hand-built one is compared with it.

Then, on rank 0 alone: how far one process's batch statistics stray from the whole batch's
when each process holds only a few samples. That noise is what SyncBatchNorm removes.
"""

import copy
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DistributedSampler

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched
from ddpcourse.scripts import import_script

flat, train = import_script("lesson3_check_equivalence", "flat", "train")  # lesson 3's comparison
CPUSyncBatchNorm = import_script("lesson7_sync_batchnorm", "CPUSyncBatchNorm")  # the step's own

DEFAULT_BATCH = 48  # small: rank 0 trains the whole batches again, alone


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="test_resnet", help="a timm model with BatchNorm")
    parser.add_argument("--steps", type=int, default=5, help="SGD steps to compare")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"the global batch (default {DEFAULT_BATCH}, rounded down to split "
                             "over the processes)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--impl", choices=["auto", "solutions", "student"], default="auto",
                        help="whose sync_batch_norm (auto: the solution if present)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.steps < 1 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--steps and --batch-size must be at least 1")
    return args


def load_sync_batch_norm(impl, rank, device):
    """The exercise's sync_batch_norm, or None (with a note) while it is a stub."""
    from ddpcourse.exercises import exercises_for_a_script

    exercises, impl = exercises_for_a_script(7, impl)
    function = exercises.sync_batch_norm
    try:  # a one-process group is enough to tell a stub from code: every rank tries alike
        function(torch.ones(2, 1, device=device), None, None, torch.ones(1, device=device),
                 torch.zeros(1, device=device))
    except NotImplementedError:
        if rank == 0:
            print("note: sync_batch_norm is not written yet (exercise l7_sync_batchnorm in "
                  "lessons/lesson7/exercises.py); its rows are left out")
        return None, impl
    return function, impl


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

    try:
        args.batch_size, per_process, rounded = split_batch(args.batch_size, DEFAULT_BATCH,
                                                            world_size)
    except ValueError as mistake:
        fail(str(mistake))
    CPUSyncBatchNorm.sync_batch_norm, impl = load_sync_batch_norm(args.impl, rank, device)

    train_set, _ = load_datasets("digits")
    if args.steps * args.batch_size > len(train_set):
        fail(f"{args.steps} steps of {args.batch_size} need more than the "
             f"{len(train_set)} training images; take fewer steps")
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    mine = list(BatchSampler(sampler, per_process, drop_last=True))[:args.steps]
    shares = [None] * world_size if rank == 0 else None
    dist.gather_object(mine, shares, dst=0)

    def batch(indices):
        images, labels = zip(*(train_set[i] for i in indices), strict=True)
        return torch.stack(images).double(), torch.stack(labels)

    torch.manual_seed(args.seed)
    # float64 throughout: the rows compare normalisations, not kernels' rounding. In float32
    # two kernels round apart by 1e-7, enough to tip a near-tie (ReLU at 0, say) one way or the
    # other; training then amplifies it (one process, 5 steps: 1.2e-3 off, rising 50x a step).
    start = create_model(args.model, NUM_CLASSES["digits"]).to(device, torch.float64)
    variants = [("BatchNorm", lambda m: m)]
    if CPUSyncBatchNorm.sync_batch_norm is not None:
        variants.append(("hand-built SyncBatchNorm", CPUSyncBatchNorm.convert))
    variants.append(("nn.SyncBatchNorm", nn.SyncBatchNorm.convert_sync_batchnorm))
    rows, finals = [], {}
    for variant, convert in variants:
        model = convert(copy.deepcopy(start))
        try:
            ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
            train(ddp_model, [batch(idx) for idx in mine], args.lr, device)
        except ValueError as refused:  # nn.SyncBatchNorm on CPU tensors
            rows.append({"normalisation": variant, "max |DDP - one process|": "-",
                         "ranks agree": "-", "verdict": f"refused: {refused}"})
            continue
        final = flat(ddp_model.module)
        copies = [torch.empty_like(final) for _ in range(world_size)]
        dist.all_gather(copies, final)
        finals[variant] = copies
        rows.append({"normalisation": variant})

    spread = []
    if rank == 0:  # the reference: plain BatchNorm, alone, on the whole global batches
        alone = copy.deepcopy(start)
        whole = [batch(sum((share[k] for share in shares), [])) for k in range(args.steps)]
        train(alone, whole, args.lr, device)
        reference = flat(alone)
        for row in rows:
            if row["normalisation"] not in finals:
                continue
            copies = finals[row["normalisation"]]
            diff = max((c - reference).abs().max().item() for c in copies)
            agree = all(torch.equal(c, copies[0]) for c in copies)
            row.update({"max |DDP - one process|": f"{diff:.2e}",
                        "ranks agree": "yes" if agree else "NO",
                        "verdict": "same" if diff <= args.tolerance and agree else "differs"})
        if "nn.SyncBatchNorm" in finals and "hand-built SyncBatchNorm" in finals:
            gap = (finals["nn.SyncBatchNorm"][0] - finals["hand-built SyncBatchNorm"][0])
            rows.append({"normalisation": "hand-built vs nn.SyncBatchNorm",
                         "max |DDP - one process|": f"{gap.abs().max().item():.2e}",
                         "ranks agree": "-", "verdict": "(the two, compared)"})

        # How noisy are one process's batch statistics when it holds n samples? The input of
        # the last BatchNorm (the fewest values per sample), per channel, against the
        # statistics of all the samples together.
        with torch.no_grad():
            bn = [m for m in start.modules() if isinstance(m, nn.BatchNorm2d)][-1]
            seen = []
            hook = bn.register_forward_pre_hook(lambda _m, inputs: seen.append(inputs[0]))
            start.eval()
            start(torch.stack([train_set[i][0] for i in range(512)]).to(device, torch.float64))
            hook.remove()
            values = seen[0].transpose(0, 1).flatten(1)  # channels x values
            mean, var = values.mean(1), values.var(1)
            for n in (2, 4, 8, 16, 32, 64):
                chunks = [c.transpose(0, 1).flatten(1) for c in seen[0].split(n)[: 512 // n]]
                off_mean = torch.stack([(c.mean(1) - mean).abs() / var.sqrt() for c in chunks])
                off_var = torch.stack([(c.var(1) / var - 1).abs() for c in chunks])
                spread.append({"samples per process": n, "values per channel": chunks[0].shape[1],
                               "|batch mean - mean| / std": f"{off_mean.mean().item():.3f}",
                               "|batch var / var - 1|": f"{off_var.mean().item():.3f}"})

    if rank == 0:
        print(f"DDP on {world_size} process(es) x {per_process} samples vs one process x "
              f"{args.batch_size}{rounded}: {args.model}, {args.steps} SGD steps, "
              f"{device.type}/{backend}; sync_batch_norm from {impl}")
        print(format_table(rows))
        print(f"one process's batch statistics against those of 512 samples ({args.model}'s "
              "last BatchNorm; means over channels and batches):")
        print(format_table(spread))
        verdict = {r["normalisation"]: r.get("max |DDP - one process|", "-") for r in rows}
        hand = verdict.get("hand-built SyncBatchNorm", "-")
        passed = hand != "-" and float(hand) <= args.tolerance
        if hand != "-":
            verb = "reproduces" if passed else "DOES NOT reproduce"
            print(f"check: the hand-built SyncBatchNorm {verb} one-process training within "
                  f"{args.tolerance:g}")
        print(summary_line(world_size=world_size, steps=args.steps,
                           global_batch=args.batch_size, batch_per_process=per_process,
                           bn_max_diff=verdict["BatchNorm"], sync_bn_max_diff=hand,
                           equivalent="yes" if passed else "no",
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()
    if rank == 0 and CPUSyncBatchNorm.sync_batch_norm is not None and not passed:
        sys.exit(1)


if __name__ == "__main__":
    main()
