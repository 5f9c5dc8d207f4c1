"""Lesson 6: the resumable training, told to stop: a snapshot at once, then exit; rerun, resume.

    make lesson6-preempt NPROC=2     # SIGTERM under torchrun, then a SLURM job requeued
    torchrun --nproc-per-node=2 scripts/lesson6_preemptible.py --epochs 8 --fresh
    kill -TERM <torchrun's pid>      # as a scheduler does; run the command again without --fresh

A scheduler that stops a job (SLURM preempting it, or its time limit near; torchrun told to
stop) sends SIGTERM first and SIGKILL some seconds later. Snapshots every few steps lose the
steps since the last one; this script saves at the signal and loses none.
It is lesson6_resumable.py plus that (SIGTERM and SIGUSR1 caught):
    diff scripts/lesson6_resumable.py scripts/lesson6_preemptible.py
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.exercises import exercises_for_a_script
from ddpcourse.models import create_model
from ddpcourse.report import summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched

# The learning rate belongs to the GLOBAL batch: 0.1 for 256 samples per optimizer step.
# Linear scaling rule: change the global batch by a factor k and scale the rate by k too.
BASE_LR, BASE_BATCH = 0.1, 256
# Stopped, not finished: the status of a process ended by SIGTERM (128 + 15), so torchrun,
# SLURM or a shell reading it never takes the run for complete.
PREEMPTED = 143

# The signal only raises a flag: saving inside the handler could catch the model half-way
# through optimizer.step(), or a rank inside a collective that the others never join.
stop_signal: list[str] = []


def note_stop(signum, frame):
    stop_signal.append(signal.Signals(signum).name)


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
    parser.add_argument("--snapshot", default="runs/lesson6_snapshot.pt",
                        help="resumed from, and written (the one before kept as SNAPSHOT.prev)")
    parser.add_argument("--snapshot-every", type=int, default=4, help="steps between snapshots")
    parser.add_argument("--fresh", action="store_true", help="remove the snapshots, start over")
    parser.add_argument("--events", help="append a JSON line per step here (the drills read it)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.epochs < 0 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--epochs must be >= 0 and --batch-size >= 1")
    if args.snapshot_every < 1:
        parser.error("--snapshot-every must be >= 1")
    return args


@torch.no_grad()
def evaluate(model, loader, device):
    """[correct predictions, samples seen] over `loader`, as a tensor on `device`."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # summed on the device
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        counts[0] += (model(images).argmax(1) == labels).sum()
        counts[1] += len(labels)
    return counts


def main():
    args = parse_args()
    started = time.perf_counter()
    # SIGTERM: SLURM's and torchrun's "stop now" (then SIGKILL: 30 s later by default in both:
    # SLURM's KillWait, torchrun's shutdown timeout). SIGUSR1: what `sbatch --signal=USR1@60`
    # sends a minute before the job's time limit.
    for caught in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(caught, note_stop)

    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])              # this process, 0 .. world_size - 1
    local_rank = int(os.environ["LOCAL_RANK"])  # its number on this node: picks the GPU
    world_size = int(os.environ["WORLD_SIZE"])  # processes in the job

    device, backend = pick_device(local_rank)  # cuda:LOCAL_RANK with nccl, else CPU with gloo
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # A resume is bit-identical only if a kernel gives the same bits each time it runs:
        # cuDNN's fastest convolutions add in a racing order. Deterministic ones, cuBLAS too.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    exercises, _ = exercises_for_a_script(6)  # lessons/lesson6/exercises.py, or the reference

    # The global batch stays what it was on one device; each process takes an equal share.
    # Left out, it is 256 rounded down to split (255 = 3 x 85); given, it must split exactly.
    try:  # args.batch_size becomes the global batch this run really trains with
        args.batch_size, batch_size, rounded = split_batch(args.batch_size, BASE_BATCH, world_size)
    except ValueError as mistake:  # every rank meets it: rank 0 says so, the others wait
        fail(str(mistake))

    train_set, val_set = load_datasets(args.dataset, args.data_dir, args.image_size)
    # Validation: every world_size-th image, no sampler padding: each one counted once.
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)),
                            batch_size=batch_size)

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = create_model(args.model, NUM_CLASSES[args.dataset], args.pretrained).to(device)
    # DDP copies rank 0's weights everywhere, then averages gradients during backward().
    # find_unused_parameters=True for what it also does: DDP keeps its first buckets, not
    # regrouping the gradients after a process's first step (which a resumed process would do
    # at another step than the run that never stopped: with 3+ ranks, other sums' last bits).
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
                find_unused_parameters=True)
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    # A cosine learning rate over the run, and random flips: more state a snapshot must keep.
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs * (len(train_set) // args.batch_size + 1))
    flips = torch.Generator().manual_seed(args.seed)  # the same draws on every rank (below)

    # --fresh: rank 0 removes the snapshots, and every rank waits for that (the barrier)
    # before it looks for one: else a fast rank could resume from a file about to vanish.
    if args.fresh and rank == 0:
        for stale in (args.snapshot, f"{args.snapshot}.prev"):
            Path(stale).unlink(missing_ok=True)
    dist.barrier()
    first_epoch = start = step = 0  # where the run is: epoch, positions of it trained, steps
    if Path(args.snapshot).exists() or Path(f"{args.snapshot}.prev").exists():
        try:  # every rank reads it, onto its own device; a damaged file gives way to .prev
            state, used = exercises.load_snapshot(args.snapshot, map_location=device)
            progress = exercises.restore_state(state, model.module, optimizer, scheduler, flips)
        except (exercises.SnapshotError, KeyError, ValueError, RuntimeError) as error:
            if isinstance(error, NotImplementedError):
                raise  # a stub: said in one line at the end of this file
            fail(f"cannot resume: {' '.join(str(error).split())[:300]} (or start with --fresh)")
        first_epoch, start, step = progress["epoch"], progress["start"], progress["step"]
        if rank == 0:
            print(f"resume: from {used}: epoch {first_epoch + 1}, {start} of its samples done, "
                  f"step {step}; {world_size} process(es) now")

    parameters = sum(p.numel() for p in model.parameters())
    if rank == 0:  # rank 0 speaks for the job
        print(f"{args.model} ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
              f"{len(train_set)} training and {len(val_set)} validation images, "
              f"{world_size} process(es) on {device.type} with {backend}")
        print(f"global batch {args.batch_size} = {world_size} process(es) x {batch_size}, "
              f"lr {lr:g}{rounded}")

    train_loss = val_acc = float("nan")
    train_seconds = trained = 0
    for epoch in range(first_epoch, args.epochs):
        # DistributedSampler's split of the epoch's shuffle from position `start` on (at any
        # world size); the loader draws its seed from the epoch, not from torch's generator.
        train_loader = DataLoader(
            train_set, batch_size=batch_size, generator=torch.Generator().manual_seed(epoch),
            sampler=exercises.resume_indices(len(train_set), args.seed, epoch, start, rank,
                                             world_size))
        model.train()
        tick = time.perf_counter()
        # Running sums stay on the device: .item() would make the CPU wait for the GPU at
        # every step. They are read once, when the epoch ends.
        stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, seen
        for images, labels in train_loader:
            # One coin per place in the global batch, each rank taking its places' (as above).
            flip = (torch.rand(args.batch_size, generator=flips)[rank::world_size] < 0.5)
            images = torch.where(flip[:len(images), None, None, None], images.flip(-1), images)
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step, start = step + 1, start + args.batch_size
            if args.events:  # which worker is where, for the drills (every rank appends a line)
                with open(args.events, "a") as f:
                    f.write(json.dumps({"step": step, "rank": rank, "world_size": world_size,
                                        "pid": os.getpid(), "agent": os.getppid(),
                                        "time": time.time()}) + "\n")
            # Rank 0 alone writes (DDP keeps the ranks' states equal); not at an epoch's end.
            if step % args.snapshot_every == 0 and start < len(train_set) and rank == 0:
                exercises.save_snapshot(exercises.capture_state(
                    model.module, optimizer, scheduler, flips,
                    {"epoch": epoch, "start": start, "step": step}), args.snapshot)
            stats[0] += loss.detach() * len(labels)  # detach: no graph across the epoch
            stats[1] += (logits.argmax(1) == labels).sum()
            stats[2] += len(labels)
            # The ranks see the signal at different steps: they stop together, after the
            # first step at which any of them has it (MAX over the ranks, every step).
            stopping = torch.tensor([1.0 if stop_signal else 0.0], device=device)
            dist.all_reduce(stopping, op=dist.ReduceOp.MAX)
            if stopping.item() and start < len(train_set):  # at an epoch's end: finish it
                if rank == 0:
                    exercises.save_snapshot(exercises.capture_state(
                        model.module, optimizer, scheduler, flips,
                        {"epoch": epoch, "start": start, "step": step}), args.snapshot)
                    print(f"preempted: {stop_signal[0] if stop_signal else 'a signal'} "
                          f"after step {step}; snapshot written to {args.snapshot}; exiting "
                          "so that the job can start again", flush=True)
                dist.barrier()  # no rank leaves before the snapshot is on disk
                dist.destroy_process_group()
                sys.exit(PREEMPTED)
        dist.all_reduce(stats)  # sums over ranks: the loss and accuracy of the whole epoch
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        train_seconds += time.perf_counter() - tick
        trained += int(seen)

        # Each rank's batches moved its own BatchNorm statistics: use rank 0's, as saved.
        for buffer in model.module.buffers():
            dist.broadcast(buffer, src=0)
        # The plain model: its forward does no collectives, so shard sizes may differ.
        counts = evaluate(model.module, val_loader, device)
        dist.all_reduce(counts)  # correct and seen, summed over the ranks' shards
        val_correct, val_seen = counts.tolist()
        train_loss, val_acc = loss_sum / seen, val_correct / val_seen
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  "
                  f"train acc {correct / seen:.3f}  val acc {val_acc:.3f} "
                  f"({int(val_seen)} images)  {time.perf_counter() - tick:.1f} s")
        start = 0  # the next epoch from its beginning

    if rank == 0:  # one checkpoint, written once: every rank holds the same weights
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        torch.save({"model": model.module.state_dict(), "args": vars(args)}, args.checkpoint)
        print(f"checkpoint: {args.checkpoint}")
        print(summary_line(world_size=world_size, batch_per_process=batch_size,
                           global_batch=args.batch_size, epochs=args.epochs,
                           train_loss=train_loss, val_acc=val_acc,
                           samples_per_s=round(trained / max(train_seconds, 1e-9)),
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except NotImplementedError as stub:  # one line, not a traceback, while one is a stub
        fail(f"{stub}: write it in lessons/lesson6/exercises.py (this script runs it)")
