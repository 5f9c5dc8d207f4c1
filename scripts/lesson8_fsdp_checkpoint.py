"""Lesson 8: FSDP2's training with a sharded checkpoint, resumed at any number of processes.

    make lesson8-fsdp NPROC=2                           # prints, then runs, these commands:
    torchrun --nproc-per-node=2 scripts/lesson8_fsdp_checkpoint.py
    python scripts/lesson8_fsdp_checkpoint.py --resume runs/lesson8_fsdp_checkpoint \
        --epochs 0 --checkpoint runs/lesson8_fsdp_resumed    # one process reads what W wrote

It is lesson8_fsdp.py with the checkpoint sharded too: no rank gathers the whole model;
every rank writes its own pieces with torch.distributed.checkpoint (rank 0 also an index of
where each piece lies), and --resume reads back the pieces each rank now owns, whatever
number of processes wrote them:
    diff scripts/lesson8_fsdp.py scripts/lesson8_fsdp_checkpoint.py
"""

import math
import os
import time
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
                        help=f"the global batch, all devices together (default {BASE_BATCH}, "
                             "rounded down to split over the processes)")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"learning rate for the global batch (default {BASE_LR} x "
                             f"batch-size / {BASE_BATCH}: the linear scaling rule)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default=f"runs/{Path(__file__).stem}",
                        help="a folder: one file of pieces per rank, and their index")
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
    """[correct predictions, samples seen] over `loader`, as a tensor on `device`, after
    `batches` forwards: FSDP's forward gathers weights, a collective every rank must join."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # summed on the device
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        counts[0] += (model(images).argmax(1) == labels).sum()
        counts[1] += len(labels)
    for _ in range(batches - len(loader)):  # this rank's share ran out: forwards not counted
        model(images)
    return counts


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
    # Validation: every world_size-th image, no sampler padding: each one counted once.
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)),
                            batch_size=batch_size)
    val_batches = math.ceil(len(range(0, len(val_set), world_size)) / batch_size)  # rank 0's

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = create_model(args.model, NUM_CLASSES[args.dataset], args.pretrained).to(device)
    # FSDP2 over a 1-D mesh of all ranks: each block is a unit, gathered just before it runs
    # and freed after; the root unit holds the rest (stem, head). Every parameter becomes a
    # DTensor of which this rank keeps a 1/W piece. Unlike DDP, fully_shard copies nothing
    # from rank 0: the seed above gave every rank the same weights.
    # A group of its own for the mesh (DTensor keeps meshes to the end: on the world group gloo
    # aborts at exit), with the timeout, which init_device_mesh would not give it (30 min).
    mesh = DeviceMesh.from_group(dist.new_group(timeout=timedelta(seconds=args.timeout)),
                                 device.type)
    for block in blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)

    if args.resume:  # each rank reads the pieces it now owns, whatever W wrote them
        if not os.path.exists(os.path.join(args.resume, ".metadata")):
            fail(f"{args.resume} is not a checkpoint folder: it has no .metadata, the index "
                 "that dcp.save writes last")
        model_state, optimizer_state = get_state_dict(model, optimizer)  # DTensors: pieces
        state = {"model": model_state, "optimizer": optimizer_state, "run": {"val_acc": 0.0}}
        try:  # fills them in place from the files
            dcp.load(state, checkpoint_id=args.resume)
        except dcp.CheckpointException as error:  # every rank meets it: rank 0 says so
            fail(f"cannot resume from {args.resume}: {error}".splitlines()[0])
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        saved_val_acc = state["run"]["val_acc"]
        if rank == 0:
            print(f"resumed from {args.resume}, now sharded over {world_size} process(es)")

    parameters = sum(p.numel() for p in model.parameters())  # DTensors: the whole shapes
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

        # Each rank's batches moved its own BatchNorm statistics: use rank 0's, as saved.
        for buffer in model.buffers():  # FSDP does not shard buffers
            dist.broadcast(buffer, src=0)
        counts = evaluate(model, val_loader, device, val_batches)
        model.reshard()  # the root unit stays gathered after a forward, awaiting a backward
        dist.all_reduce(counts)  # correct and seen, summed over the ranks' shards
        val_correct, val_seen = counts.tolist()
        train_loss, val_acc = loss_sum / seen, val_correct / val_seen
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  "
                  f"train acc {correct / seen:.3f}  val acc {val_acc:.3f} "
                  f"({int(val_seen)} images)  {time.perf_counter() - tick:.1f} s")

    if args.resume and not args.epochs:  # no step taken: the weights as loaded, validated
        counts = evaluate(model, val_loader, device, val_batches)
        model.reshard()
        dist.all_reduce(counts)
        val_acc = counts[0].item() / counts[1].item()
        if rank == 0:
            print(f"resumed weights: val acc {val_acc:.3f} ({int(counts[1])} images); "
                  f"the run that saved them: val acc {saved_val_acc:.3f}")

    # What each rank holds, in rank order: a 1/W piece of everything.
    reports = [None] * world_size if rank == 0 else None
    dist.gather_object(held_bytes(model, optimizer), reports, dst=0)
    # A sharded checkpoint: every rank writes its own pieces, rank 0 also the index. dcp.save
    # overwrites an older checkpoint in the folder file by file (lesson 6's write-then-rename
    # would keep the old one whole until the new one is complete).
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state, "run": {"val_acc": val_acc}},
             checkpoint_id=args.checkpoint)
    # Only for the reader: the whole weights gathered on rank 0, named by a hash of their bits,
    # which a run resumed from this checkpoint at another world size prints again.
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    if rank == 0:
        for r, held in enumerate(reports):
            print(f"rank {r}: weights {mb(held['params'])} MB, gradients {mb(held['grads'])} MB, "
                  f"momentum {mb(held['optimizer'])} MB")
        print(f"checkpoint: {args.checkpoint} (sharded, {world_size} writer(s)): weights "
              f"fingerprint {fingerprint(whole)} ({len(whole)} tensors)")
        trained_loss = {"train_loss": train_loss} if args.epochs else {}  # none without a step
        print(summary_line(world_size=world_size, batch_per_process=batch_size,
                           global_batch=args.batch_size, epochs=args.epochs,
                           **trained_loss, val_acc=val_acc,
                           samples_per_s=round(trained / max(train_seconds, 1e-9)),
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
