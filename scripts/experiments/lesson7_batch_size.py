"""Lesson 7 experiment: grow the batch until memory is full; the learning rate follows (lesson 3).

    make lesson7-batch NPROC=2                          # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/experiments/lesson7_batch_size.py

It takes lesson3_ddp.py's set-up, learning-rate rule and evaluation, and replaces its
training loop with measurements:

1. For each batch size: samples/s and the memory a training step needs. On a GPU that is
   torch.cuda.max_memory_allocated, and the search stops at the first out-of-memory error
   (the real thing, met by one step of a plain copy of the model first: an error in the
   middle of a DDP step would leave the other ranks waiting in its all-reduce). A CPU has
   no such limit worth reaching (the machine would swap, or the kernel would kill the
   job), so the search stops at --memory-budget-mb, and the memory is what autograd saves
   for backward (counted by saved_tensors_hooks, in a forward of its own: the hooks' Python
   calls would slow the timed steps) plus the weights, their gradients and the optimizer's
   momentum.
2. Then the question that decides whether a bigger batch helps: trained for the same number
   of epochs at a small batch and a big one, the big one with the learning rate scaled by
   lesson 3's linear rule (0.1 x global / 256) and without scaling it, how good is the model?
   A bigger batch means fewer steps per epoch: it helps only while the steps it saves cost
   less than the samples/s it gains, and while there are enough steps left to learn.
"""

import copy
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import pick_device, world_of_one_unless_launched
from ddpcourse.scripts import import_script

# lesson 3's linear rule (0.1 for a global batch of 256) and its evaluation
BASE_BATCH, BASE_LR, evaluate = import_script("lesson3_ddp", "BASE_BATCH", "BASE_LR", "evaluate")

MB = 2**20


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--model", default="test_resnet", help="a timm model name")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--smallest", type=int, default=8, help="first per-process batch")
    parser.add_argument("--largest", type=int, default=1024,
                        help="stop doubling here even if memory is left")
    parser.add_argument("--memory-budget-mb", type=float, default=64,
                        help="on the CPU: the memory a step may use (a GPU has its own limit)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per batch size")
    parser.add_argument("--compare", type=int, default=16,
                        help="part 2 trains at --smallest and at this many times it (at most the "
                             "largest batch that fits)")
    parser.add_argument("--train-epochs", type=int, default=2,
                        help="epochs for the learning-rate comparison (0 leaves it out)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.smallest < 1 or args.largest < args.smallest or min(args.steps, args.compare) < 1 or \
            args.train_epochs < 0:
        parser.error("--smallest >= 1, --largest >= --smallest, --steps and --compare >= 1, "
                     "--train-epochs >= 0")
    return args


def step_cost(model, optimizer, images, labels, device):
    """(seconds, bytes) of one training step on this batch."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    tick = time.perf_counter()
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter() - tick, torch.cuda.max_memory_allocated(device)
    seconds = time.perf_counter() - tick
    saved = [0]

    def count(tensor):
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    plain = getattr(model, "module", model)  # a forward outside DDP: no backward owed
    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        F.cross_entropy(plain(images), labels)  # counted, never backward
    # weights + gradients + momentum: three tensors the size of the model
    fixed = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
    return seconds, saved[0] + fixed


def train_and_evaluate(start, train_set, val_set, batch_size, lr, epochs, rank, world_size,
                       local_rank, device, seed):
    model = DDP(copy.deepcopy(start), device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed)
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    steps = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for images, labels in loader:
            loss = F.cross_entropy(model(images.to(device)), labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
    for buffer in model.module.buffers():  # rank 0's BatchNorm statistics, as in lesson 3
        dist.broadcast(buffer, src=0)
    shard = Subset(val_set, range(rank, len(val_set), world_size))
    counts = evaluate(model.module, DataLoader(shard, batch_size=256), device)
    dist.all_reduce(counts)
    return counts[0].item() / counts[1].item(), steps


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])              # this process, 0 .. world_size - 1
    local_rank = int(os.environ["LOCAL_RANK"])  # its number on this node: picks the GPU
    world_size = int(os.environ["WORLD_SIZE"])  # processes in the job

    device, backend = pick_device(local_rank)  # cuda:LOCAL_RANK with nccl, else CPU with gloo
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    train_set, val_set = load_datasets(args.dataset, image_size=args.image_size)
    torch.manual_seed(args.seed)
    start = create_model(args.model, NUM_CLASSES[args.dataset]).to(device)
    if device.type == "cuda":
        limit = f"the GPU's {torch.cuda.get_device_properties(device).total_memory / MB:.0f} MB"
    else:
        limit = f"a budget of {args.memory_budget_mb:g} MB (--memory-budget-mb)"

    # 1. Double the batch until a step no longer fits.
    rows, batch, fits = [], args.smallest, args.smallest
    while batch <= args.largest:
        model = DDP(copy.deepcopy(start),
                    device_ids=[local_rank] if device.type == "cuda" else None)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        generator = torch.Generator().manual_seed(args.seed + rank)
        picks = torch.randint(len(train_set), (batch,), generator=generator)
        images = torch.stack([train_set[i][0] for i in picks.tolist()]).to(device)
        labels = torch.stack([train_set[i][1] for i in picks.tolist()]).to(device)
        verdict = torch.zeros(3, dtype=torch.float64, device=device)  # s, bytes, out of memory
        if device.type == "cuda":  # does one step fit? Asked with no collective in flight
            try:
                probe = copy.deepcopy(model.module)
                step_cost(probe, torch.optim.SGD(probe.parameters(), lr=0.01, momentum=0.9),
                          images, labels, device)
            except torch.OutOfMemoryError:
                verdict[2] = 1
            del probe
            torch.cuda.empty_cache()
        fits_everywhere = verdict[2:].clone()
        dist.all_reduce(fits_everywhere, op=dist.ReduceOp.MAX)
        if not fits_everywhere.item():
            costs = [step_cost(model, optimizer, images, labels, device)
                     for _ in range(args.steps + 1)][1:]  # the first step warms up
            verdict[0] = sorted(c[0] for c in costs)[len(costs) // 2]
            verdict[1] = max(c[1] for c in costs)
            if device.type != "cuda" and verdict[1] > args.memory_budget_mb * MB:
                verdict[2] = 1
        else:
            verdict[2] = 1
        del model, optimizer, images, labels
        if device.type == "cuda":
            torch.cuda.empty_cache()
        dist.all_reduce(verdict, op=dist.ReduceOp.MAX)  # the tightest rank decides
        global_batch = batch * world_size
        rows.append({"batch/process": batch, "global batch": global_batch,
                     "samples/s (all ranks)": f"{global_batch / verdict[0].item():.0f}"
                     if verdict[0] > 0 else "-",
                     "step memory MB": f"{verdict[1].item() / MB:.1f}" if verdict[1] else "-",
                     "fits": "no" if verdict[2] else "yes",
                     "lr (linear rule)": f"{BASE_LR * global_batch / BASE_BATCH:.4g}"})
        if verdict[2]:
            break
        fits, batch = batch, batch * 2

    # 2. The same epochs at a small batch and a big one that fits: rule or no rule.
    trained = []
    if args.train_epochs:
        small, big = args.smallest, min(fits, args.smallest * args.compare)
        for batch, rule in [(small, True), (big, True), (big, False)]:
            lr = BASE_LR * batch * world_size / BASE_BATCH if rule else \
                BASE_LR * small * world_size / BASE_BATCH
            tick = time.perf_counter()
            accuracy, steps = train_and_evaluate(start, train_set, val_set, batch, lr,
                                                 args.train_epochs, rank, world_size,
                                                 local_rank, device, args.seed)
            trained.append({"global batch": batch * world_size, "lr": f"{lr:.4g}",
                            "lr from": "linear rule" if rule else f"batch {small * world_size}",
                            "steps": steps, "val acc": f"{accuracy:.3f}",
                            "wall s": f"{time.perf_counter() - tick:.1f}"})

    if rank == 0:
        print(f"{args.model} at {args.image_size}x{args.image_size}, {world_size} process(es), "
              f"{device.type}/{backend}; memory limit: {limit}")
        print(format_table(rows))
        print(f"largest per-process batch that fits: {fits} (global {fits * world_size})")
        if trained:
            print(f"{args.train_epochs} epoch(s) each, from the same start:")
            print(format_table(trained))
        print(summary_line(world_size=world_size, largest_batch_per_process=fits,
                           val_acc=",".join(t["val acc"] for t in trained) or "-",
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
