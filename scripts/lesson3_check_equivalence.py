"""Lesson 3: check that DDP on W processes reproduces training in one process, step for step.

    make check-ddp NPROC=4                              # prints, then runs, this command:
    torchrun --nproc-per-node=4 scripts/lesson3_check_equivalence.py --steps 5

Every rank trains a few SGD steps with DDP on its share (batch-size / W samples) of each
global batch. Rank 0 gathers everyone's final parameters, trains a copy of the same
starting model alone on the whole global batches, in the same order, and prints the largest
difference. Without BatchNorm the two agree to float rounding; with BatchNorm they do not.
"""

import copy
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DistributedSampler

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched

DEFAULT_BATCH = 48  # small: rank 0 trains the whole batches again, alone


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="test_vit",
                        help="a timm model without BatchNorm or dropout: DDP must match it")
    parser.add_argument("--bn-model", default="test_resnet",
                        help="a model with BatchNorm (the one lesson3_ddp.py trains)")
    parser.add_argument("--steps", type=int, default=5, help="SGD steps to compare")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"the global batch (default {DEFAULT_BATCH}, rounded down to split "
                             "over the processes)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.steps < 1 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--steps and --batch-size must be at least 1")
    return args


def train(model, batches, lr, device):
    """Plain SGD over `batches`: the same code trains the DDP model and the lone one."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    for images, labels in batches:
        loss = F.cross_entropy(model(images.to(device)), labels.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def normalisation(model):
    """The kinds of normalisation layer in `model`, e.g. "LayerNorm"."""
    kinds = [nn.SyncBatchNorm, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d), nn.GroupNorm,
             nn.LayerNorm]
    names = ["SyncBatchNorm", "BatchNorm", "GroupNorm", "LayerNorm"]
    found = {next(n for k, n in zip(kinds, names, strict=True) if isinstance(m, k))
             for m in model.modules() if isinstance(m, tuple(kinds))}
    return "+".join(sorted(found)) or "none"


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

    # Mistakes every rank meets: rank 0 reports them (fail), the other ranks wait for it.
    try:  # the default 48 is rounded down to split (45 = 5 x 9); a given batch must split
        args.batch_size, per_process, rounded = split_batch(args.batch_size, DEFAULT_BATCH,
                                                            world_size)
    except ValueError as mistake:
        fail(str(mistake))

    train_set, _ = load_datasets("digits")
    if args.steps * args.batch_size > len(train_set):
        fail(f"{args.steps} steps of {args.batch_size} need more than the "
             f"{len(train_set)} training images; take fewer steps")
    # My share of each global batch: the indices DistributedSampler gives this rank.
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    mine = list(BatchSampler(sampler, per_process, drop_last=True))[:args.steps]
    # Rank 0 learns every rank's share: global batch k is the union of the k-th shares.
    shares = [None] * world_size if rank == 0 else None
    dist.gather_object(mine, shares, dst=0)

    # Dropout draws random masks: one process draws them for the whole batch from one
    # stream, each DDP process for its share from its own, so the masks differ. Both runs
    # start their streams from the same seed, so on one process the masks are the same.
    # BatchNorm normalises with the mean and variance of the samples it sees: under DDP each
    # process sees batch-size / W of them, so its gradients are not those of the one-process
    # run, and the BatchNorm model differs. SyncBatchNorm computes the statistics over all
    # processes, which restores the match, but only for GPU modules: the CPU refuses it.
    rows, max_diff = [], {}
    candidates = [("", args.model), ("dropout 0.2", args.model), ("", args.bn_model),
                  ("SyncBatchNorm", args.bn_model)]
    for variant, name in candidates:
        torch.manual_seed(args.seed)
        options = {"drop_rate": 0.2} if variant.startswith("dropout") else {}
        model = create_model(name, NUM_CLASSES["digits"], **options).to(device)
        start = copy.deepcopy(model.state_dict())  # rank 0's copy is what DDP hands everyone
        label = f"{name} + {variant}" if variant else name
        if variant == "SyncBatchNorm":
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        norm = normalisation(model)
        try:
            ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
        except ValueError as refused:
            rows.append({"model": label, "normalisation": norm, "max |DDP - one process|": "-",
                         "ranks agree": "-", "verdict": f"refused: {refused}"})
            continue
        torch.manual_seed(args.seed)  # the dropout masks' stream, as for the lone run below
        train(ddp_model, [train_set[idx] for idx in mine], args.lr, device)

        final = flat(ddp_model.module)
        finals = [torch.empty_like(final) for _ in range(world_size)]
        dist.all_gather(finals, final)  # every rank's parameters, to compare them on rank 0
        if rank == 0:
            alone = create_model(name, NUM_CLASSES["digits"], **options).to(device)
            alone.load_state_dict(start)
            torch.manual_seed(args.seed)
            whole = [sum((share[k] for share in shares), []) for k in range(args.steps)]
            train(alone, [train_set[idx] for idx in whole], args.lr, device)
            reference = flat(alone)
            diff = max((f - reference).abs().max().item() for f in finals)
            agree = all(torch.equal(f, finals[0]) for f in finals)
            max_diff[label] = diff
            rows.append({"model": label, "normalisation": norm,
                         "max |DDP - one process|": f"{diff:.2e}",
                         "ranks agree": "yes" if agree else "NO",
                         "verdict": "same" if diff <= args.tolerance and agree else "differs"})

    if rank == 0:
        print(f"DDP on {world_size} process(es) x {per_process} samples vs one process x "
              f"{args.batch_size}{rounded}: {args.steps} SGD steps, the same samples in the "
              f"same order, {device.type}/{backend}")
        print(format_table(rows))
        plain = max_diff[args.model]
        passed = rows[0]["verdict"] == "same"
        print(f"check: DDP {'reproduces' if passed else 'DOES NOT reproduce'} one-process "
              f"training of {args.model} within {args.tolerance:g}")
        print(summary_line(world_size=world_size, steps=args.steps,
                           global_batch=args.batch_size, batch_per_process=per_process,
                           max_diff=f"{plain:.2e}", bn_max_diff=f"{max_diff[args.bn_model]:.2e}",
                           dropout_max_diff=f"{max_diff[args.model + ' + dropout 0.2']:.2e}",
                           tolerance=args.tolerance, equivalent="yes" if passed else "no",
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()
    if rank == 0 and not passed:
        sys.exit(1)


if __name__ == "__main__":
    main()
