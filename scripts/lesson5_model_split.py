"""Lesson 5: lesson 3's DDP with each process driving k devices, the model split over them.

    make lesson5-split NPROC=2                          # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/lesson5_model_split.py --devices-per-process 2

Lesson 1's second layout: local rank g owns devices k*g .. k*g+k-1. The model is cut into k
stages, stage i on the process's device i, and the activations move from one to the next
(model parallelism inside the process). DDP keeps the processes in step as in lesson 3, but
with device_ids=None: a module on several devices has no one device for DDP to put inputs on.
Without GPUs every stage is on the CPU: the same code, and the same numbers as lesson 3.
It is lesson3_ddp.py plus the split:
    diff scripts/lesson3_ddp.py scripts/lesson5_model_split.py
"""

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from timm.models import ResNet
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

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
    parser.add_argument("--devices-per-process", "-k", type=int, default=None,
                        help="k: the devices each process drives, one model stage on each "
                             "(default 2, fewer where the node has fewer GPUs per process)")
    args = parser.parse_args()
    if args.epochs < 0 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--epochs must be >= 0 and --batch-size >= 1")
    if args.devices_per_process is not None and not 1 <= args.devices_per_process <= 8:
        parser.error("--devices-per-process must be between 1 and 8")
    return args


class Split(nn.Module):
    """A timm ResNet cut into len(devices) stages, stage i on devices[i]. A ResNet's forward
    runs its children in order, so consecutive runs of them are the stages."""

    def __init__(self, model: ResNet, devices: list[torch.device]):
        super().__init__()
        children, k = list(model.children()), len(devices)
        cuts = [round(i * len(children) / k) for i in range(k + 1)]  # k = 2: two halves
        self.devices = devices
        self.stages = nn.ModuleList(nn.Sequential(*children[a:b]).to(device) for a, b, device
                                    in zip(cuts[:-1], cuts[1:], devices, strict=True))

    def forward(self, x):
        for stage, device in zip(self.stages, self.devices, strict=True):
            x = stage(x.to(device))  # the activations move to the stage's device
        # The logits go back to the first device, where the loop keeps the labels and sums.
        return x.to(self.devices[0])


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

    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])              # this process, 0 .. world_size - 1
    local_rank = int(os.environ["LOCAL_RANK"])  # its number on this node: picks the GPU
    world_size = int(os.environ["WORLD_SIZE"])  # processes in the job
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    gpus_each = torch.cuda.device_count() // per_node if torch.cuda.is_available() else 2
    k = args.devices_per_process or max(1, min(2, gpus_each))

    # This process's k devices start at k x LOCAL_RANK, not at LOCAL_RANK: local rank 1 of
    # k = 2 owns cuda:2 and cuda:3. `device`, the first, takes the inputs and the sums.
    device, backend = pick_device(k * local_rank)  # cuda:k*LOCAL_RANK with nccl, else CPU
    if device.type == "cuda":
        if k * per_node > torch.cuda.device_count():
            fail(f"{per_node} process(es) x {k} GPUs need {k * per_node} GPUs on this node, "
                 f"which shows {torch.cuda.device_count()}: lower NPROC or --devices-per-process")
        torch.cuda.set_device(device)
    devices = [torch.device(device.type, device.index + i) if device.type == "cuda" else device
               for i in range(k)]  # without GPUs all k stages are on the CPU
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

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = create_model(args.model, NUM_CLASSES[args.dataset], args.pretrained)
    if not isinstance(model, ResNet):
        fail(f"--model {args.model}: the split cuts a timm ResNet (test_resnet, resnet18, ...)")
    model = Split(model, devices)  # each stage moved to its device
    # DDP copies rank 0's weights everywhere, then averages gradients during backward().
    # device_ids=None: the module spans several devices (DDP refuses device_ids for one).
    model = DDP(model, device_ids=None)
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)

    parameters = sum(p.numel() for p in model.parameters())
    if rank == 0:  # rank 0 speaks for the job
        print(f"{args.model} ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
              f"{len(train_set)} training and {len(val_set)} validation images, "
              f"{world_size} process(es) on {device.type} with {backend}")
        print(f"global batch {args.batch_size} = {world_size} process(es) x {batch_size}, "
              f"lr {lr:g}{rounded}")
    where = [None] * world_size if rank == 0 else None  # each process's stages, in rank order
    dist.gather_object(", ".join(f"stage {i} on {d}" for i, d in enumerate(devices)), where)
    if rank == 0:
        print("\n".join(f"rank {r}: {stages}" for r, stages in enumerate(where)))

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

    if rank == 0:  # one checkpoint, written once: every rank holds the same weights
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        torch.save({"model": model.module.state_dict(), "args": vars(args)}, args.checkpoint)
        print(f"checkpoint: {args.checkpoint}")
        print(summary_line(world_size=world_size, devices_per_process=k,
                           batch_per_process=batch_size,
                           global_batch=args.batch_size, epochs=args.epochs,
                           train_loss=train_loss, val_acc=val_acc,
                           samples_per_s=round(trained / max(train_seconds, 1e-9)),
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
