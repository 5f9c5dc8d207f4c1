"""Lesson 8: lesson 3's training with FSDP2: weights, gradients and optimizer state sharded.

    make lesson8-fsdp NPROC=2                           # prints, then runs, these commands:
    torchrun --nproc-per-node=2 scripts/lesson8_fsdp.py --epochs 2
    python scripts/lesson8_fsdp.py --resume runs/lesson8_fsdp_checkpoint --epochs 0 \
        --checkpoint runs/lesson8_fsdp_resumed    # one process reads what W wrote

It is lesson3_ddp.py with DDP replaced by fully_shard: each residual block, then the whole
model, becomes a unit whose parameters are cut into W pieces, one per rank. Before a unit
runs (forward, and again in backward) the ranks all-gather its weights, and free them after;
its gradients are reduce-scattered, so each rank receives the average of its own piece only,
and the optimizer steps that piece. The checkpoint is sharded too: every rank writes its
pieces with torch.distributed.checkpoint, and --resume reads them back at any world size.
    diff scripts/lesson3_ddp.py scripts/lesson8_fsdp.py
"""

import itertools
import math
import os
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched
from ddpcourse.sharding import blocks, fingerprint, held_bytes, mb

# The learning rate belongs to the GLOBAL batch: 0.1 for 256 samples per optimizer step.
# Linear scaling rule: change the global batch by a factor k and scale the rate by k too.
BASE_LR, BASE_BATCH = 0.1, 256


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--data-dir", default="data", help="where cifar10 looks for its files")
    parser.add_argument("--image-size", type=int, default=None,
                        help="image side in pixels (default: 16 for digits, 32 for cifar10)")
    parser.add_argument("--model", default="test_resnet", help="a timm model name")
    parser.add_argument("--pretrained", action="store_true",
                        help="start from timm's pretrained weights (must be on this machine)")
    parser.add_argument("--epochs", type=int, default=8, help="0 measures start-up alone")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="the global batch: samples per optimizer step, all devices together "
                             f"(default {BASE_BATCH}, rounded down to split over the processes)")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"learning rate for the global batch (default {BASE_LR} x "
                             f"batch-size / {BASE_BATCH}: the linear scaling rule)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default=f"runs/{Path(__file__).stem}_checkpoint",
                        help="a folder: one file of shards per rank, and their index")
    parser.add_argument("--resume", default=None,
                        help="start from this checkpoint folder, saved at any world size")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.epochs < 0 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--epochs must be >= 0 and --batch-size >= 1")
    return args


@torch.no_grad()
def evaluate(model, loader, device, batches):
    """[correct predictions, samples seen] over `loader`, as a tensor on `device`.

    Runs exactly `batches` forward passes: FSDP's forward gathers each unit's weights, a
    collective, so every rank must run as many as the others. A rank whose share ran out
    repeats a batch and does not count it."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # summed on the device
    for i, (images, labels) in enumerate(itertools.islice(itertools.cycle(loader), batches)):
        images, labels = images.to(device), labels.to(device)
        predicted = model(images).argmax(1)
        if i < len(loader):
            counts[0] += (predicted == labels).sum()
            counts[1] += len(labels)
    return counts


def main():
    args = parse_args()
    started = time.perf_counter()

    world_of_one_unless_launched("make lesson8-fsdp NPROC=2  (or: torchrun --nproc-per-node=2 "
                                 "scripts/lesson8_fsdp.py)")
    rank = int(os.environ["RANK"])              # this process, 0 .. world_size - 1
    local_rank = int(os.environ["LOCAL_RANK"])  # its number on this node: picks the GPU
    world_size = int(os.environ["WORLD_SIZE"])  # processes in the job

    device, backend = pick_device(local_rank)  # cuda:LOCAL_RANK with nccl, else CPU with gloo
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    # The global batch stays what it was on one device; each process takes an equal share.
    # Left out, it is 256 rounded down to split (255 = 3 x 85); given, it must split exactly.
    try:  # args.batch_size becomes the global batch this run really trains with
        args.batch_size, batch_size, rounded = split_batch(args.batch_size, BASE_BATCH, world_size)
    except ValueError as mistake:  # every rank meets it: rank 0 says so, the others wait
        fail(str(mistake))

    train_set, val_set = load_datasets(args.dataset, args.data_dir, args.image_size)
    # Each process reads its own 1/world_size of the shuffled training set (set_epoch below).
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    # Validation: every world_size-th image from `rank` on, without the padding
    # DistributedSampler adds, so that each image is counted exactly once.
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)),
                            batch_size=batch_size)
    val_batches = math.ceil(math.ceil(len(val_set) / world_size) / batch_size)  # rank 0's

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = create_model(args.model, NUM_CLASSES[args.dataset], args.pretrained).to(device)
    # FSDP2: a 1-D mesh of all ranks. Each block is a unit of its own, gathered just before
    # it runs and freed after; the root unit holds the rest (the stem and the head). Every
    # rank keeps its 1/W piece of each parameter: a DTensor, of which it holds the local part.
    # The mesh gets a group of its own (all ranks): DTensor's caches keep a mesh, and its
    # group, until the process ends, and the world group must be free to end cleanly.
    mesh = DeviceMesh.from_group(dist.new_group(), device.type)
    for block in blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    if args.resume:  # each rank reads the pieces it now owns, whatever W wrote them
        if not os.path.exists(os.path.join(args.resume, ".metadata")):
            fail(f"{args.resume} is not a checkpoint folder: it has no .metadata, the index "
                 "that dcp.save writes last")
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        try:
            dcp.load(state, checkpoint_id=args.resume)
        except dcp.CheckpointException as error:  # every rank meets it: rank 0 says so
            why = next(iter(error.failures.values()))  # (exception, frames), from each rank
            fail(f"cannot resume from {args.resume}: {why[0] if isinstance(why, tuple) else why}")
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])

    parameters = sum(p.numel() for p in model.parameters())  # DTensors: the whole shapes
    if args.resume:  # the whole weights, gathered on rank 0 only to name them by their bits
        whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
        if rank == 0:
            print(f"resumed from {args.resume}: weights fingerprint {fingerprint(whole)} "
                  f"({len(whole)} tensors), now sharded over {world_size} process(es)")
    if rank == 0:  # rank 0 speaks for the job
        print(f"{args.model} ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
              f"{len(train_set)} training and {len(val_set)} validation images, "
              f"{world_size} process(es) on {device.type} with {backend}")
        print(f"global batch {args.batch_size} = {world_size} process(es) x {batch_size}, "
              f"lr {lr:g}{rounded}")

    train_loss = val_acc = float("nan")
    train_seconds = trained = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle every epoch, the same one on every rank
        model.train()
        tick = time.perf_counter()
        # Running sums stay on the device: .item() would make the CPU wait for the GPU at
        # every step. They are read once, when the epoch ends.
        stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, seen
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            stats[0] += loss.detach() * len(labels)  # detach: no graph across the epoch
            stats[1] += (logits.argmax(1) == labels).sum()
            stats[2] += len(labels)
        dist.all_reduce(stats)  # sums over ranks: the loss and accuracy of the whole epoch
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        train_seconds += time.perf_counter() - tick
        trained += int(seen)

        # Each rank's last batch moved its own BatchNorm running statistics: validate with
        # rank 0's, the ones the checkpoint keeps. FSDP does not shard buffers.
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)
        counts = evaluate(model, val_loader, device, val_batches)
        model.reshard()  # the root unit stays gathered after a forward, waiting for a backward
        dist.all_reduce(counts)  # correct and seen, summed over the ranks' shards
        val_correct, val_seen = counts.tolist()
        train_loss, val_acc = loss_sum / seen, val_correct / val_seen
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  "
                  f"train acc {correct / seen:.3f}  val acc {val_acc:.3f} "
                  f"({int(val_seen)} images)  {time.perf_counter() - tick:.1f} s")

    # What each rank holds, in rank order: a piece of everything.
    reports = [None] * world_size if rank == 0 else None
    dist.gather_object(held_bytes(model, optimizer), reports, dst=0)
    # A sharded checkpoint: every rank writes its own pieces (and rank 0 the index), no rank
    # ever holds the whole model. torch.distributed.checkpoint can load them at another W.
    model_state, optimizer_state = get_state_dict(model, optimizer)
    # dcp.save overwrites the files of an older checkpoint in the folder, and warns each time
    # (lesson 6's write-then-rename would keep the old one whole until the new one is done).
    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=args.checkpoint)
    # Only for the reader: the whole weights on rank 0, named by a hash of their bits, which a
    # run resumed from this checkpoint at another world size prints again.
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    if rank == 0:
        for r, held in enumerate(reports):
            print(f"rank {r}: weights {mb(held['params'])} MB, gradients {mb(held['grads'])} MB, "
                  f"momentum {mb(held['optimizer'])} MB")
        print(f"checkpoint: {args.checkpoint} (sharded, {world_size} writer(s)): weights "
              f"fingerprint {fingerprint(whole)} ({len(whole)} tensors)")
        print(summary_line(world_size=world_size, batch_per_process=batch_size,
                           global_batch=args.batch_size, epochs=args.epochs,
                           train_loss=train_loss, val_acc=val_acc,
                           samples_per_s=round(trained / max(train_seconds, 1e-9)),
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
