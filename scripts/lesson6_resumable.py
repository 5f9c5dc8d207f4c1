"""Lesson 6: lesson 3's DDP training, made to survive a failure: snapshots and exact resume.

    make lesson6 NPROC=2             # runs this, then kills it mid-run and checks the resume
    torchrun --nproc-per-node=2 --max-restarts=3 scripts/lesson6_resumable.py

Every --snapshot-every steps, and at every epoch end, rank 0 writes a snapshot: weights,
optimizer, scheduler, where the run is in its epoch, and every random state that shapes
training. Started again (by torchrun after a failure, or by you), the run continues from it
and ends with the same weights, bit for bit, as a run that never stopped.
It is lesson 3's script plus the lines that make it resumable:
    diff scripts/lesson3_ddp.py scripts/lesson6_resumable.py
"""

import json
import math
import os
import random
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched

SNAPSHOT_FORMAT = 1  # raised when the snapshot's contents change

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
    parser.add_argument("--checkpoint", default=f"runs/{Path(__file__).stem}.pt")
    parser.add_argument("--snapshot", default="runs/lesson6_snapshot.pt",
                        help="the snapshot to resume from and to write (the one before it is "
                             "kept as SNAPSHOT.prev)")
    parser.add_argument("--snapshot-every", type=int, default=4, help="steps between snapshots")
    parser.add_argument("--fresh", action="store_true",
                        help="remove the snapshots and start from the beginning")
    parser.add_argument("--events", default=None,
                        help="append one JSON line per step, snapshot and resume (for drills)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.epochs < 0 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--epochs must be >= 0 and --batch-size >= 1")
    if args.snapshot_every < 1:
        parser.error("--snapshot-every must be >= 1")
    return args


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch part-way through.

    `start` counts the epoch's samples already trained, over all ranks. A step of global batch
    B takes positions [k*B, (k+1)*B) of the epoch's shuffled (and padded) order, rank r every
    W-th of them from r: skipping `start` positions resumes exactly, even at another W.
    """

    start = 0  # until set_position says otherwise: the whole epoch

    def set_position(self, epoch: int, start: int) -> None:
        self.set_epoch(epoch)
        self.start = start

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)  # the order depends on the epoch only
        order = torch.randperm(len(self.dataset), generator=generator).tolist()
        order += order[: self.total_size - len(order)]  # padded as DistributedSampler pads
        return iter(order[self.start:][self.rank:: self.num_replicas])

    def __len__(self) -> int:
        return math.ceil((self.total_size - self.start) / self.num_replicas)


def flip_some(images, generator):
    """Random horizontal flips from this rank's own generator: a random state to keep."""
    flip = torch.rand(len(images), generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


class SnapshotError(Exception):
    """No usable snapshot: the message names the file and what is wrong with it."""


def save_snapshot(state: dict, path: str) -> None:
    """Write `state` so that `path` always holds a complete snapshot.

    The new snapshot goes to a temporary file first, is flushed to the disk, and only then
    takes the name: the one before it becomes PATH.prev. A crash at any moment leaves either
    the old snapshot or the new one, never half of one.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        os.replace(path, f"{path}.prev")
    os.replace(temporary, path)  # atomic: readers see the old file or the new one


def load_snapshot(path: str, map_location, expect: dict) -> tuple[dict, str, list[str]]:
    """(snapshot, the file it came from, notes) from `path`, else from PATH.prev.

    A file that cannot be read (truncated, corrupt) or that belongs to another run
    (`expect`: model, dataset, format) is skipped with a note saying why.
    """
    notes = []
    for candidate in (path, f"{path}.prev"):
        if not os.path.exists(candidate):
            continue
        try:
            state = torch.load(candidate, map_location=map_location, weights_only=False)
            if not isinstance(state, dict) or "progress" not in state:
                raise ValueError("it is not a snapshot of this script")
        except Exception as error:  # torch.load raises several kinds for a damaged file
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            notes.append(f"{candidate} is unreadable ({type(error).__name__}: {reason[:120]})")
            continue
        wrong = [f"{key} {state.get(key)!r}, not {value!r}" for key, value in expect.items()
                 if state.get(key) != value]
        if wrong:
            notes.append(f"{candidate} belongs to another run: " + ", ".join(wrong))
            continue
        return state, candidate, notes
    if notes:
        raise SnapshotError("; ".join(notes) + " (remove it, or start over with --fresh)")
    return {}, "", notes


def gather_on_rank_0(mine, rank, world_size):
    """Every rank's `mine`, as a list on rank 0 (a collective: every rank must call it)."""
    everyone = [None] * world_size if rank == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    return everyone


def log_event(path, **event):
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(event, time=round(time.time(), 3))) + "\n")


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

    world_of_one_unless_launched("make lesson6 NPROC=3  (or: torchrun --nproc-per-node=3 "
                                 "--max-restarts=3 scripts/lesson6_resumable.py)")
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
    sampler = ResumableSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                               seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    # Validation: every world_size-th image from `rank` on, without the padding
    # DistributedSampler adds, so that each image is counted exactly once.
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)),
                            batch_size=batch_size)

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = create_model(args.model, NUM_CLASSES[args.dataset], args.pretrained).to(device)
    # DDP copies rank 0's weights to every process, then averages the gradients over all
    # processes during backward(): every optimizer step is the same on every rank.
    # find_unused_parameters=True: here, for what it also does: DDP then never regroups the
    # gradients into new buckets after a process's first step. A resumed process would do
    # its first step in other buckets than the run that never stopped, and with 3 or more
    # ranks the sums would come out in another order: equal to float rounding, not bit for bit.
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
                find_unused_parameters=True)
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    # The rate follows a cosine over the whole run: state that a snapshot must keep too.
    steps_per_epoch = math.ceil(len(train_set) / args.batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=max(1, args.epochs * steps_per_epoch))
    flips = torch.Generator().manual_seed(args.seed * 1000 + rank)  # this rank's own

    # --fresh: rank 0 removes the old snapshots, and every rank waits for that (a barrier)
    # before looking for one: else a fast rank could resume from a file about to vanish.
    if args.fresh and rank == 0:
        for stale in (args.snapshot, f"{args.snapshot}.prev", f"{args.snapshot}.tmp"):
            if os.path.exists(stale):
                os.remove(stale)
    dist.barrier()

    # Resume. Rank 0 picks the file (the newest readable one) and tells the others, so that
    # every rank loads the same snapshot even if a file changes between their reads; each
    # rank then reads it with map_location: onto its own device, not the one it was saved from.
    expect = {"model_name": args.model, "dataset": args.dataset, "format": SNAPSHOT_FORMAT}
    choice = [None, [], None]  # the file ("" for none), notes on files skipped, an error
    if rank == 0:
        try:
            _, choice[0], choice[1] = load_snapshot(args.snapshot, "cpu", expect)
        except SnapshotError as error:
            choice[2] = str(error)
    dist.broadcast_object_list(choice, src=0)
    if choice[2]:
        fail(choice[2])
    epoch, start, step = 0, 0, 0  # where the run is: epoch, samples of it done, steps done
    stats_so_far = [0.0, 0.0, 0.0]  # this rank's loss sum, correct and seen in the epoch
    if choice[0]:
        snapshot = torch.load(choice[0], map_location=device, weights_only=False)
        model.module.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        scheduler.load_state_dict(snapshot["scheduler"])
        epoch, start, step = (snapshot["progress"][k] for k in ("epoch", "start", "step"))
        torch.set_rng_state(snapshot["rng"]["torch"].cpu())
        random.setstate(snapshot["rng"]["python"])
        np.random.set_state(snapshot["rng"]["numpy"])
        ranks_then = snapshot["ranks"]  # what each rank had, by rank
        if len(ranks_then) == world_size:
            flips.set_state(ranks_then[rank]["flips"].cpu())
            stats_so_far = ranks_then[rank]["stats"]
        else:  # another world size (an elastic job shrank or grew): new per-rank streams,
            flips.manual_seed(args.seed * 1000 + rank + 7919 * step)  # and rank 0 holds
            stats_so_far = [sum(r["stats"][i] for r in ranks_then) if rank == 0 else 0.0
                            for i in range(3)]                       # the epoch's sums
        if rank == 0:
            for note in choice[1]:
                print(f"warning: {note}; using {choice[0]}")
            print(f"resume: from {choice[0]}: epoch {epoch + 1}, {start} of its samples done, "
                  f"step {step}; written by {snapshot['world_size']} process(es), now "
                  f"{world_size}")
        log_event(args.events, event="resume", rank=rank, step=step, epoch=epoch, start=start,
                  world_size=world_size, pid=os.getpid())
        del snapshot

    def take_snapshot():
        """Rank 0 writes it; gathering the ranks' generator states needs every rank."""
        ranks = gather_on_rank_0({"flips": flips.get_state(), "stats": stats_so_far}, rank,
                                 world_size)
        if rank == 0:
            tick = time.perf_counter()
            save_snapshot({
                "format": SNAPSHOT_FORMAT, "model_name": args.model, "dataset": args.dataset,
                "world_size": world_size, "global_batch": args.batch_size,
                "progress": {"epoch": epoch, "start": start, "step": step},
                "model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                        "numpy": np.random.get_state()},
                "ranks": ranks,
            }, args.snapshot)
            log_event(args.events, event="snapshot", rank=rank, step=step, epoch=epoch,
                      start=start, seconds=round(time.perf_counter() - tick, 4))

    parameters = sum(p.numel() for p in model.parameters())
    if rank == 0:  # rank 0 speaks for the job
        print(f"{args.model} ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
              f"{len(train_set)} training and {len(val_set)} validation images, "
              f"{world_size} process(es) on {device.type} with {backend}")
        print(f"global batch {args.batch_size} = {world_size} process(es) x {batch_size}, "
              f"lr {lr:g}{rounded}")

    train_loss = val_acc = float("nan")
    train_seconds = trained = 0
    resumed_rng = torch.get_rng_state()  # restored below, once the epoch's iterator exists
    while epoch < args.epochs:
        sampler.set_position(epoch, start)  # this epoch's shuffle, minus the samples done
        model.train()
        tick = time.perf_counter()
        # Running sums stay on the device: .item() would make the CPU wait for the GPU at
        # every step. They are read once, when the epoch ends; a snapshot keeps them.
        stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, seen
        if start:
            stats += torch.tensor(stats_so_far, dtype=torch.float64, device=device)
        batches = iter(train_loader)
        if start:  # iter() drew a seed from torch's generator: mid-epoch, the run had drawn it
            torch.set_rng_state(resumed_rng)  # before the snapshot, so undo this second draw
        for images, labels in batches:
            images, labels = flip_some(images, flips).to(device), labels.to(device)
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            stats[0] += loss.detach() * len(labels)  # detach: no graph across the epoch
            stats[1] += (logits.argmax(1) == labels).sum()
            stats[2] += len(labels)
            step += 1
            start = min(start + args.batch_size, len(train_set))
            if args.events:  # .item() waits for the device: only when asked for the log
                log_event(args.events, event="step", rank=rank, step=step, epoch=epoch,
                          start=start, world_size=world_size, pid=os.getpid(),
                          agent=os.getppid(), loss=loss.item())
            if step % args.snapshot_every == 0 and start < len(train_set):
                stats_so_far = stats.tolist()
                take_snapshot()
        dist.all_reduce(stats)  # sums over ranks: the loss and accuracy of the whole epoch
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        train_seconds += time.perf_counter() - tick
        trained += int(seen)

        # Each rank's last batch moved its own BatchNorm running statistics: validate with
        # rank 0's, the ones the checkpoint keeps.
        for buffer in model.module.buffers():
            dist.broadcast(buffer, src=0)
        # The plain model inside DDP: its forward does no collectives, so ranks may run
        # different numbers of validation batches.
        counts = evaluate(model.module, val_loader, device)
        dist.all_reduce(counts)  # correct and seen, summed over the ranks' shards
        val_correct, val_seen = counts.tolist()
        train_loss, val_acc = loss_sum / seen, val_correct / val_seen
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  "
                  f"train acc {correct / seen:.3f}  val acc {val_acc:.3f} "
                  f"({int(val_seen)} images)  {time.perf_counter() - tick:.1f} s")
        epoch, start, stats_so_far = epoch + 1, 0, [0.0, 0.0, 0.0]
        take_snapshot()  # at every epoch end: the next epoch starts from it

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
    main()
