"""Lesson 8 experiment: what each rank holds under DDP, ZeRO-1 and FSDP2, measured beside the
prediction, and the collectives of one step of each.

    make lesson8-memory NPROC=2                  # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/experiments/lesson8_memory.py

Lesson 3's model trains for a few steps three times, from the same weights on the same
batches, as the three steps of lesson 8 set it up: wrapped in DDP (every rank keeps
everything, and DDP's buckets keep a second copy of the gradients); in DDP with
ZeroRedundancyOptimizer (scripts/lesson8_zero.py: a rank keeps optimizer state for its share
of the parameters only); and sharded with FSDP2's fully_shard, one unit per residual block
(scripts/lesson8_fsdp.py: weights, gradients and optimizer state all sharded). After the last
step every rank counts the bytes it really holds; rank 0 prints them beside
ddpcourse.sharding.predict's numbers, the collectives each step started (torch's flight
recorder), and checks that the three runs trained the same model.
"""

import gc
import json
import os
import time
from datetime import timedelta

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # the flight recorder counts collectives

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import (
    end_with_rank_0s_verdict,
    fail,
    pick_device,
    world_of_one_unless_launched,
)
from ddpcourse.scripts import import_script
from ddpcourse.sharding import (
    blocks,
    collectives,
    count_collectives,
    held_bytes,
    mb,
    predict,
    shapes_of,
)

# lesson 3's learning-rate rule
BASE_BATCH, BASE_LR = import_script("lesson3_ddp", "BASE_BATCH", "BASE_LR")

OPTIMIZERS = {"adam": (torch.optim.Adam, {"lr": 1e-3}),
              "sgd_momentum": (torch.optim.SGD, {"momentum": 0.9})}  # lr: lesson 3's rule


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="test_resnet", help="a timm model name")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam",
                        help="adam keeps two values per parameter, sgd_momentum one")
    parser.add_argument("--steps", type=int, default=3, help="training steps of each run")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"the global batch (default {BASE_BATCH}, rounded down to split)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--margin", type=float, default=0.001,
                        help="largest relative difference between a rank's measured and "
                             "predicted bytes that counts as agreeing (default 0.1 %%)")
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest relative loss difference that counts as the same")
    parser.add_argument("--record", default=None,
                        help="append this run's measurements to a JSON-lines file (figures)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.steps < 1 or args.margin < 0 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--steps and --batch-size must be at least 1, --margin at least 0")
    return args


def build(strategy, args, device, local_rank, mesh, lr):
    """The model and optimizer of one strategy, from the same initial weights as the others."""
    torch.manual_seed(args.seed)
    model = create_model(args.model, NUM_CLASSES["digits"]).to(device)
    optimizer_class, options = OPTIMIZERS[args.optimizer]
    options = {"lr": lr, **options}
    device_ids = [local_rank] if device.type == "cuda" else None
    if strategy == "ddp":       # everything whole on every rank; gradients all-reduced
        model = DDP(model, device_ids=device_ids)
        optimizer = optimizer_class(model.parameters(), **options)
    elif strategy == "zero":    # gradients all-reduced as in DDP; optimizer state sharded
        model = DDP(model, device_ids=device_ids)
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer_class,
                                            **options)
    else:                       # FSDP2: weights, gradients and optimizer state sharded
        for block in blocks(model):  # one unit per block: gathered just before it runs
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)  # the rest (stem, head) in the root unit
        optimizer = optimizer_class(model.parameters(), **options)  # steps DTensor shards
    return model, optimizer


def train(strategy, args, batches, device, local_rank, mesh, lr):
    """Train one strategy on `batches`; its losses, what every rank holds after the last
    step (on rank 0), the collectives of that step, and the whole trained weights."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, optimizer = build(strategy, args, device, local_rank, mesh, lr)
    losses = []
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        seen = len(collectives())
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step_collectives = collectives()[seen:]  # this step's, before ours below
        total = loss.detach().double() * len(labels)
        dist.all_reduce(total)
        losses.append(total.item() / (len(labels) * world_size))
    held = held_bytes(model, optimizer)  # after a step: gradients and state all exist
    held["buckets"] = 0
    if isinstance(model, DDP):  # DDP's buckets: a second copy of the gradients
        # No public API reports their sizes on the CPU: DDP's logging data (private) does.
        sizes = model._get_ddp_logging_data().get("bucket_sizes", "")
        held["buckets"] = sum(int(s) for s in str(sizes).replace(",", " ").split())
        held["total"] += held["buckets"]
    if device.type == "cuda":
        held["allocated"] = torch.cuda.memory_allocated(device)
    every = [None] * world_size if rank == 0 else None
    dist.gather_object(held, every, dst=0)
    return {"losses": losses, "held": every, "weights": full_weights(model),
            "collectives": count_collectives(step_collectives),
            "shapes": shapes_of(model.module if isinstance(model, DDP) else model)}


def full_weights(model):
    """name -> the whole parameter (an FSDP shard gathered from every rank: a collective)."""
    return {name.removeprefix("module."):
            (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters()}


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
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    try:
        batch, per_process, rounded = split_batch(args.batch_size, BASE_BATCH, world_size)
    except ValueError as mistake:
        fail(str(mistake))
    train_set, _ = load_datasets("digits")
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
    loader = DataLoader(train_set, batch_size=per_process, sampler=sampler, drop_last=True)
    if args.steps > len(loader):
        fail(f"--steps {args.steps} is more than the {len(loader)} full batches of an epoch")
    batches = [b for _, b in zip(range(args.steps), loader, strict=False)]  # the same for all
    lr = BASE_LR * batch / BASE_BATCH if args.optimizer == "sgd_momentum" else 1e-3

    # FSDP's mesh: all ranks, in a group of their own, as in lesson8_fsdp.py. DTensor's caches
    # keep a mesh, and its group, until the process ends; the world group must end cleanly.
    mesh = DeviceMesh.from_group(dist.new_group(timeout=timedelta(seconds=args.timeout)),
                                 device.type)
    runs = {}
    for strategy in ("ddp", "zero", "fsdp"):
        runs[strategy] = train(strategy, args, batches, device, local_rank, mesh, lr)
        # A model's hooks and its sharding state refer to each other: collect them now, so
        # that nothing keeps the process group alive past destroy_process_group.
        gc.collect()
    shapes = runs["ddp"]["shapes"]

    if rank == 0:
        numel = sum(torch.Size(s).numel() for s in shapes)
        print(f"{args.model}: {numel:,} parameters in {len(shapes)} tensors "
              f"({mb(4 * numel)} MB in fp32), {args.optimizer}, {world_size} process(es) on "
              f"{device.type} with {backend}, global batch {batch} = {world_size} x "
              f"{per_process}{rounded}")
        rows, worst = [], 0.0
        for strategy, run in runs.items():
            predicted = predict(shapes, world_size, strategy, args.optimizer)
            for r, (held, expect) in enumerate(zip(run["held"], predicted, strict=True)):
                off = abs(held["total"] - expect["total"]) / expect["total"]
                worst = max(worst, off)
                rows.append({"strategy": strategy, "rank": r, "params MB": mb(held["params"]),
                             "grads MB": mb(held["grads"]), "buckets MB": mb(held["buckets"]),
                             "optimizer MB": mb(held["optimizer"]),
                             "total MB": mb(held["total"]), "predicted MB": mb(expect["total"]),
                             "difference": f"{100 * off:.3f} %"})
                if "allocated" in held:
                    rows[-1]["cuda allocated MB"] = mb(held["allocated"])
        print(format_table(rows))
        print("buckets: DDP's copy of the gradients, the buffers its all-reduces run on "
              "(ddp and zero; gradient_as_bucket_view=True would make the gradients views of them)")
        for strategy, run in runs.items():
            print(f"collectives of one step, {strategy}: {run['collectives']}")
        for step in range(args.steps):
            print(f"step {step + 1}/{args.steps}  loss  " + "  ".join(
                f"{s} {run['losses'][step]:.6f}" for s, run in runs.items()))
        same = True
        for strategy in ("zero", "fsdp"):
            loss_diff = max(abs(a - b) / abs(b) for a, b in
                            zip(runs[strategy]["losses"], runs["ddp"]["losses"], strict=True))
            weight_diff = max((runs[strategy]["weights"][n] - w).abs().max().item()
                              for n, w in runs["ddp"]["weights"].items())
            ok = loss_diff <= args.tolerance
            same = same and ok
            print(f"check: {strategy} {'matches' if ok else 'DOES NOT match'} ddp over "
                  f"{args.steps} steps (largest relative loss difference {loss_diff:.1e}, "
                  f"largest weight difference {weight_diff:.1e}, tolerance {args.tolerance:g})")
        agree = worst <= args.margin
        print(f"check: measured bytes {'agree' if agree else 'DO NOT agree'} with the prediction "
              f"on every rank (largest difference {100 * worst:.3f} %, margin "
              f"{100 * args.margin:g} %)")
        if args.record:
            with open(args.record, "a") as f:
                f.write(json.dumps({"model": args.model, "optimizer": args.optimizer,
                                    "world_size": world_size, "shapes": shapes,
                                    "held": {s: run["held"] for s, run in runs.items()}}) + "\n")
            print(f"recorded: {args.record}")
        print(summary_line(world_size=world_size, model=args.model, optimizer=args.optimizer,
                           steps=args.steps, same_training=same, memory_agrees=agree,
                           worst_memory_diff=round(worst, 6), backend=backend,
                           wall_s=round(time.perf_counter() - started, 2)))
        failed = not (same and agree)
    else:
        failed = False
    end_with_rank_0s_verdict(failed, device)  # every rank exits as rank 0 does


if __name__ == "__main__":
    main()
