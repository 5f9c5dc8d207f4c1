"""Lesson 10: the transformer cut into pipeline stages (pp) on each data-parallel row (dp).

    make lesson10-pipeline NPROC=2                      # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/lesson10_pipeline.py

An 8 x 8 digit becomes a sequence of 8 tokens (its rows) of 8 features each: a linear
embedding plus learned positions, 2 blocks (LayerNorm, 2-head self-attention, LayerNorm, MLP),
the tokens' mean, a linear head: 4 pieces, dealt out as stages to the --pp ranks of each row of
a dp x pp grid, where a torch.distributed.pipelining --schedule runs them; the rows split the
data. W=2 (1 x 2) trains lesson10_transformer.py's weights on 1 process, W=4 (2 x 2) on 2:
    diff scripts/lesson10_transformer.py scripts/lesson10_pipeline.py
"""

import copy
import os
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import pipelining
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.report import summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched

# The learning rate belongs to the GLOBAL batch: 0.1 for 256 samples per optimizer step.
# Linear scaling rule: change the global batch by a factor k and scale the rate by k too.
BASE_LR, BASE_BATCH = 0.1, 256
SCHEDULES = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B,  # 1 stage a rank
             "interleaved-1f1b": pipelining.ScheduleInterleaved1F1B,  # these two: 2 stages a rank
             "interleaved-zb": pipelining.ScheduleInterleavedZeroBubble}


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--data-dir", default="data", help="where cifar10 looks for its files")
    parser.add_argument("--image-size", type=int, default=8,
                        help="image side in pixels: a sequence of this many tokens (rows)")
    parser.add_argument("--width", type=int, default=32, help="features of a token inside")
    parser.add_argument("--pp", type=int, help="pipeline ranks (default: 2 if W is even, else 1)")
    parser.add_argument("--schedule", choices=SCHEDULES, default="gpipe")
    parser.add_argument("--micro-batches", type=int, default=4, help="M: pieces of each batch")
    parser.add_argument("--epochs", type=int, default=16, help="0 measures start-up alone")
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
    args = parser.parse_args()
    if args.epochs < 0 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--epochs must be >= 0 and --batch-size >= 1")
    return args


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)): a pre-norm transformer block."""

    def __init__(self, width: int, heads: int = 2):
        super().__init__()
        self.head_width = width // heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        batch, tokens, _ = x.shape
        h = self.norm1(x)
        # (batch, heads, tokens, head_width); -1: the heads there are (fewer if q is split)
        q, k, v = (f(h).view(batch, tokens, -1, self.head_width).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        attended = F.scaled_dot_product_attention(q, k, v)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, tokens, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(nn.Module):
    """An image's rows as tokens: embed, add positions, 2 blocks, average, classify."""

    def __init__(self, side: int, width: int, classes: int, blocks: int = 2):
        super().__init__()
        self.embed = nn.Linear(side, width)
        self.positions = nn.Parameter(torch.randn(side, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, images):
        x = self.embed(images[:, 0]) + self.positions if self.embed else images  # rows of pixels
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(1)) if self.head else x  # a stage: what it holds


def stage_of(model: Transformer, s: int, n: int) -> Transformer:
    """A copy of `model` emptied but for stage s's pieces (n stages of 4), under its names."""
    start, stop, model = round(s * 4 / n), round((s + 1) * 4 / n), copy.deepcopy(model)
    if start > 0:
        model.embed = model.positions = None
    for piece in {1, 2} - set(range(start, stop)):
        model.blocks[piece - 1] = nn.Identity()
    if stop < 4:
        model.norm = model.head = None
    return model


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

    device, backend = pick_device(local_rank)  # cuda:LOCAL_RANK with nccl, else CPU with gloo
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    pp, per_rank = args.pp or 2 - world_size % 2, 2 if "interleaved" in args.schedule else 1
    if min(pp, args.micro_batches) < 1 or world_size % pp or args.micro_batches % pp or (
            pp * per_rank > 4):  # 4 pieces; M % pp == 0 meets torch's rules (1F1B: M >= S)
        fail(f"--pp {pp} must divide W = {world_size} and --micro-batches, be <= {4 // per_rank}")
    n_stages, dp, (dp_rank, pp_rank) = pp * per_rank, world_size // pp, divmod(rank, pp)
    row, _ = dist.new_subgroups(pp, timeout=timedelta(seconds=args.timeout))  # a pipeline
    column, _ = dist.new_subgroups_by_enumeration(  # the ranks holding the same stages: dp
        [[*range(p, world_size, pp)] for p in range(pp)], timeout=timedelta(seconds=args.timeout))
    # The global batch stays what it was on one device; each row (dp rank) takes a share.
    # Left out, it is 256 rounded down to split (255 = 3 x 85); given, it must split exactly.
    try:  # args.batch_size becomes the global batch this run really trains with
        args.batch_size, batch_size, rounded = split_batch(args.batch_size, BASE_BATCH, dp)
    except ValueError as mistake:  # every rank meets it: rank 0 says so, the others wait
        fail(str(mistake))
    size = -(-batch_size // args.micro_batches) * args.micro_batches  # padded to M equal pieces

    train_set, val_set = load_datasets(args.dataset, args.data_dir, args.image_size)
    # Each row reads its own 1/dp of the shuffled training set (set_epoch below).
    sampler = DistributedSampler(train_set, num_replicas=dp, rank=dp_rank, shuffle=True,
                                 seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    # Validation: every world_size-th image, no sampler padding: each one counted once.
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)),
                            batch_size=batch_size)

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = Transformer(args.image_size, args.width, NUM_CLASSES[args.dataset]).to(device)
    held = range(pp_rank, n_stages, pp)  # rank r of a row holds stage r (and r + pp)
    stages = [pipelining.PipelineStage(stage_of(model, s, n_stages), s, n_stages, device,
                                       group=row) for s in held]  # sends to its row's neighbours
    first, last = 0 in held, n_stages - 1 in held  # the stage that reads, the one that scores
    schedule = SCHEDULES[args.schedule](stages if per_rank > 1 else stages[0], args.micro_batches,
                                        partial(F.cross_entropy, reduction="sum"),
                                        scale_grads=False)  # a summed loss: see the loop
    mine = nn.ModuleList(stage.submod for stage in stages)  # what this rank trains
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(mine.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)

    parameters = sum(p.numel() for p in model.parameters())
    if rank == 0:  # rank 0 speaks for the job
        print(f"a transformer ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
              f"{len(train_set)} training and {len(val_set)} validation images, "
              f"{world_size} process(es) on {device.type} with {backend}")
        print(f"global batch {args.batch_size} = {dp} row(s) x {batch_size}, {n_stages} stage(s), "
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
            # Padded to `size` (a stage's receive buffers have one shape): blank images, labelled
            samples = len(labels)  # -100, which cross_entropy ignores
            images = F.pad(images.to(device), (0, 0) * 3 + (0, size - samples))  # last dim first
            labels = F.pad(labels.to(device), (0, size - samples), value=-100)
            optimizer.zero_grad(set_to_none=True)
            logits = schedule.step(*[images] if first else [], target=labels)  # the last stage's
            for p in mine.parameters():  # gradients of a summed loss, summed over the rows, then
                dist.all_reduce(p.grad, group=column)  # divided by all their samples: the mean
                p.grad /= dp * samples  # loss's gradient (DDP's average of the equal rows' means)
            optimizer.step()
            if not last:  # only the last stage has the logits
                continue
            stats[0] += F.cross_entropy(logits.detach(), labels, reduction="sum")  # no graph kept
            stats[1] += (logits.argmax(1) == labels).sum()
            stats[2] += samples
        dist.all_reduce(stats)  # sums over ranks: the loss and accuracy of the whole epoch
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        train_seconds += time.perf_counter() - tick
        trained += int(seen)

        every = [None] * world_size  # validation on the whole model: every rank gets every stage
        dist.all_gather_object(every, {k: v.cpu() for m in mine for k, v in m.state_dict().items()})
        model.load_state_dict({k: v for weights in every for k, v in weights.items()})
        # The plain model: its forward does no collectives, so shard sizes may differ.
        counts = evaluate(model, val_loader, device)
        dist.all_reduce(counts)  # correct and seen, summed over the ranks' shards
        val_correct, val_seen = counts.tolist()
        train_loss, val_acc = loss_sum / seen, val_correct / val_seen
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  "
                  f"train acc {correct / seen:.3f}  val acc {val_acc:.3f} "
                  f"({int(val_seen)} images)  {time.perf_counter() - tick:.1f} s")

    if rank == 0:  # one checkpoint, written once: every rank holds the same weights
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        torch.save({"model": model.state_dict(), "args": vars(args)}, args.checkpoint)
        print(f"checkpoint: {args.checkpoint}")
        print(summary_line(world_size=world_size, batch_per_process=batch_size,
                           global_batch=args.batch_size, epochs=args.epochs,
                           train_loss=train_loss, val_acc=val_acc,
                           samples_per_s=round(trained / max(train_seconds, 1e-9)),
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
