"""Lesson 8: lesson 3's training as a pipeline: the model cut into stages, one per process.

    make lesson8-pipeline NPROC=2                       # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/lesson8_pipeline.py

It is lesson3_ddp.py with DDP replaced by torch.distributed.pipelining: process s keeps stage
s of the model and sends its activations to process s + 1 (their gradients come back) one
micro-batch at a time, so that the stages work at once. GPipe: all forwards, then backwards.
    diff scripts/lesson3_ddp.py scripts/lesson8_pipeline.py
"""

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.utils.data import DataLoader, DistributedSampler

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched

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
    parser.add_argument("--checkpoint", default=f"runs/{Path(__file__).stem}.pt")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    parser.add_argument("--micro-batches", type=int, default=8, help="M: pieces of each batch")
    args = parser.parse_args()
    if args.epochs < 0 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--epochs must be >= 0 and --batch-size >= 1")
    if args.micro_batches < 1 or (args.batch_size or BASE_BATCH) % args.micro_batches:
        parser.error("--micro-batches must divide the batch into equal micro-batches")
    return args


@torch.no_grad()
def evaluate(model, loader, device, schedule, first, last):
    """[correct predictions, samples seen] over `loader`, as a tensor on `device`."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # summed on the device
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        logits = schedule.eval(*[images] if first else [], target=labels if last else None)
        if last:  # forwards only, through every stage: the last one counts
            counts[0] += (logits.argmax(1) == labels).sum()
            counts[1] += len(labels)
    return counts


def main():
    args = parse_args()
    started = time.perf_counter()

    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])              # this process, 0 .. world_size - 1
    local_rank = int(os.environ["LOCAL_RANK"])  # its number on this node: picks the GPU
    world_size = int(os.environ["WORLD_SIZE"])  # processes in the job
    first, last = rank == 0, rank == world_size - 1  # the stage that reads, the one that scores

    device, backend = pick_device(local_rank)  # cuda:LOCAL_RANK with nccl, else CPU with gloo
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    # No data parallelism (one replica): every stage sees the whole batch, in M micro-batches.
    try:  # args.batch_size becomes the global batch this run really trains with
        args.batch_size, batch_size, rounded = split_batch(args.batch_size, BASE_BATCH, 1)
    except ValueError as mistake:  # every rank meets it: rank 0 says so, the others wait
        fail(str(mistake))

    train_set, val_set = load_datasets(args.dataset, args.data_dir, args.image_size)
    if batch_size > min(len(train_set), len(val_set)):  # whole batches only, below
        fail(f"--batch-size {batch_size} is more than the {min(len(train_set), len(val_set))} "
             "images of the smaller split: there would be no whole batch")
    # Every stage walks the same batches, whole ones: stages pass micro-batches of one shape.
    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, shuffle=True,
                                 seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=batch_size, drop_last=True)

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = create_model(args.model, NUM_CLASSES[args.dataset], args.pretrained).to(device)
    parameters = sum(p.numel() for p in model.parameters())
    # Lesson 5's cut: a ResNet runs its children in order, and a stage is a run of them,
    # one per process, starting at a child with weights (so that every stage has some).
    children = list(model.children())
    starts = [i for i, child in enumerate(children) if list(child.parameters())] + [len(children)]
    if world_size >= len(starts):
        fail(f"{args.model} cuts into at most {len(starts) - 1} stages, one per process")
    cuts = [starts[round(s * (len(starts) - 1) / world_size)] for s in range(world_size + 1)]
    model = torch.nn.Sequential(*children[cuts[rank]:cuts[rank + 1]])  # this process's stage
    # Receives from process rank - 1 and sends to rank + 1; GPipe runs the micro-batches.
    schedule = ScheduleGPipe(PipelineStage(model, rank, world_size, device),
                             n_microbatches=args.micro_batches, loss_fn=F.cross_entropy)
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)

    if rank == 0:  # rank 0 speaks for the job
        print(f"{args.model} ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
              f"{len(train_set)} training and {len(val_set)} validation images, "
              f"{world_size} process(es) on {device.type} with {backend}")
        print(f"batch {batch_size} in {args.micro_batches} micro-batches, lr {lr:g}; bubble "
              f"(S-1)/(M+S-1) = {(world_size - 1) / (args.micro_batches + world_size - 1):.3f}")

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
            optimizer.zero_grad(set_to_none=True)
            # This stage's forwards and backwards, sends and receives; the last gets the logits.
            logits = schedule.step(*[images] if first else [], target=labels if last else None)
            optimizer.step()
            if last:  # the batch's loss: the mean of its equal micro-batches' (no graph)
                loss = F.cross_entropy(logits, labels)
                stats[0] += loss.detach() * len(labels)  # detach: no graph across the epoch
                stats[1] += (logits.argmax(1) == labels).sum()
                stats[2] += len(labels)
        dist.all_reduce(stats)  # sums over ranks: the loss and accuracy of the whole epoch
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        train_seconds += time.perf_counter() - tick
        trained += int(seen)

        counts = evaluate(model, val_loader, device, schedule, first, last)
        dist.all_reduce(counts)  # correct and seen: the last stage's
        val_correct, val_seen = counts.tolist()
        train_loss, val_acc = loss_sum / seen, val_correct / val_seen
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  "
                  f"train acc {correct / seen:.3f}  val acc {val_acc:.3f} "
                  f"({int(val_seen)} images)  {time.perf_counter() - tick:.1f} s")

    stage_file = args.checkpoint.removesuffix(".pt") + f"_stage{rank}.pt"  # no rank has it all
    os.makedirs(os.path.dirname(stage_file) or ".", exist_ok=True)
    torch.save({"model": model.state_dict(), "args": vars(args)}, stage_file)
    if rank == 0:  # one file per stage
        print(f"checkpoint: {stage_file} ... _stage{world_size - 1}.pt")
        print(summary_line(world_size=world_size, batch_per_process=batch_size,
                           global_batch=args.batch_size, epochs=args.epochs,
                           train_loss=train_loss, val_acc=val_acc,
                           samples_per_s=round(trained / max(train_seconds, 1e-9)),
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
