"""Lesson 10: the transformer with context parallelism: each sample's tokens cut over ranks.

    make lesson10-context NPROC=4                       # prints, then runs, this command:
    torchrun --nproc-per-node=4 scripts/lesson10_context.py

A dp x cp grid of ranks (--cp: the most of 1, 2, 4, 8 that fit): a row's cp ranks share a batch,
each with a block of every sample's tokens, attention a ring. W=4 --cp 2 (2 x 2) trains
lesson10_transformer.py's weights on 2 processes; W=4 (1 x 4), its weights on 1:
    diff scripts/lesson10_transformer.py scripts/lesson10_context.py
"""

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.report import summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched

# The learning rate belongs to the GLOBAL batch: 0.1 for 256 samples per optimizer step.
# Linear scaling rule: change the global batch by a factor k and scale the rate by k too.
BASE_LR, BASE_BATCH = 0.1, 256


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--data-dir", default="data", help="where cifar10 looks for its files")
    parser.add_argument("--image-size", type=int, default=8,
                        help="image side in pixels: a sequence of this many tokens (rows)")
    parser.add_argument("--width", type=int, default=32, help="features of a token inside")
    parser.add_argument("--cp", type=int, help="ranks sharing a sample (default: most that fit)")
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


class PassOn(torch.autograd.Function):
    """Send a tensor `step` ranks on round `group`'s ring, take one from -step; backward: back."""

    @staticmethod
    def forward(ctx, group, step, t):
        ctx.group, ctx.step = group, step
        size, me = dist.get_world_size(group), dist.get_rank(group)
        arriving = torch.empty_like(t, memory_format=torch.contiguous_format)  # as gloo needs
        for request in dist.batch_isend_irecv([  # both posted at once: no rank waits first
                dist.P2POp(dist.isend, t.contiguous(), group=group, group_peer=(me + step) % size),
                dist.P2POp(dist.irecv, arriving, group=group, group_peer=(me - step) % size)]):
            request.wait()
        return arriving

    @staticmethod
    def backward(ctx, grad):
        return None, None, PassOn.apply(ctx.group, -ctx.step, grad)


def ring_attention(q, k, v, group):
    """softmax(q k^T / sqrt(d)) v for this rank's queries, every rank's keys and values in turn."""
    out, lse = 0, q.new_tensor(float("-inf"))  # lse: log of the softmax's sum so far
    for step in range(dist.get_world_size(group)):
        if step:  # the previous rank's keys and values (autograd keeps each for backward)
            k, v = PassOn.apply(group, 1, k), PassOn.apply(group, 1, v)
        scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        new_lse = torch.logaddexp(lse, scores.logsumexp(-1, keepdim=True))
        out = out * (lse - new_lse).exp() + (scores - new_lse).exp() @ v
        lse = new_lse  # online softmax: the sum grew by this block's, the rest rescaled to it
    return out


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)): a pre-norm transformer block."""

    def __init__(self, width: int, group, heads: int = 2):
        super().__init__()
        self.group = group  # the cp ranks holding the other tokens of this rank's samples
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
        attended = ring_attention(q, k, v, self.group)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, tokens, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(nn.Module):
    """An image's rows as tokens: embed, add positions, 2 blocks, average, classify."""

    def __init__(self, side: int, width: int, classes: int, group, blocks: int = 2):
        super().__init__()
        self.side, self.group, share = side, group, side // dist.get_world_size(group)
        self.rows = slice(dist.get_rank(group) * share, (dist.get_rank(group) + 1) * share)
        self.embed = nn.Linear(side, width)
        self.positions = nn.Parameter(torch.randn(side, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, group) for _ in range(blocks))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, images):
        x = self.embed(images[:, 0, self.rows]) + self.positions[self.rows]  # this rank's rows
        for block in self.blocks:
            x = block(x)
        sums = [self.norm(x).sum(1)]  # the mean needs the other ranks' tokens too
        for _ in range(dist.get_world_size(self.group) - 1):
            sums.append(PassOn.apply(self.group, 1, sums[-1]))
        return self.head(sum(sums) / self.side)


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

    cp = args.cp or max(c for c in (1, 2, 4, 8) if world_size % c == args.image_size % c == 0)
    if cp < 1 or world_size % cp or args.image_size % cp:
        fail(f"--cp {cp} must divide the {world_size} rank(s) and the {args.image_size} tokens")
    # rank = dp index x cp + cp index: a row of the grid is a cp group, a column a dp group.
    grid, timeout = torch.arange(world_size).reshape(-1, cp), timedelta(seconds=args.timeout)
    dp, dp_rank = len(grid), rank // cp  # this rank's row: its cp ranks read the same batches
    cp_group = [dist.new_group(row.tolist(), timeout=timeout) for row in grid][dp_rank]
    dp_group = [dist.new_group(col.tolist(), timeout=timeout) for col in grid.T][rank % cp]
    # The global batch stays what it was on one device; each process takes an equal share.
    # Left out, it is 256 rounded down to split (255 = 3 x 85); given, it must split exactly.
    try:  # args.batch_size becomes the global batch this run really trains with
        args.batch_size, batch_size, rounded = split_batch(args.batch_size, BASE_BATCH, dp)
    except ValueError as mistake:  # every rank meets it: rank 0 says so, the others wait
        fail(str(mistake))

    train_set, val_set = load_datasets(args.dataset, args.data_dir, args.image_size)
    # Each row reads its own 1/dp of the shuffled training set (set_epoch below).
    sampler = DistributedSampler(train_set, num_replicas=dp, rank=dp_rank, shuffle=True,
                                 seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    # Validation: every dp-th image, no padding, each counted once; a row's ranks (a ring) alike.
    val_loader = DataLoader(Subset(val_set, range(dp_rank, len(val_set), dp)),
                            batch_size=batch_size)

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = Transformer(args.image_size, args.width, NUM_CLASSES[args.dataset], cp_group).to(device)
    # DDP copies rank 0's weights everywhere, then averages gradients during backward().
    # W = dp x cp ranks: a rank's gradients are cp x its share (the ring's backward adds the cp
    # ranks' equal gradients of the loss; the head's are whole), so / W: sum over cp, mean over dp.
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)

    parameters = sum(p.numel() for p in model.parameters())
    if rank == 0:  # rank 0 speaks for the job
        print(f"a transformer ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
              f"{len(train_set)} training and {len(val_set)} validation images, "
              f"{world_size} process(es) on {device.type} with {backend}")
        print(f"global batch {args.batch_size} = {dp} row(s) of {cp} x {batch_size} (dp x cp), "
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
        dist.all_reduce(stats, group=dp_group)  # over rows: the whole epoch
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        train_seconds += time.perf_counter() - tick
        trained += int(seen)

        counts = evaluate(model.module, val_loader, device)
        dist.all_reduce(counts, group=dp_group)  # summed over the rows' shards
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
        print(summary_line(world_size=world_size, batch_per_process=batch_size,
                           global_batch=args.batch_size, epochs=args.epochs,
                           train_loss=train_loss, val_acc=val_acc,
                           samples_per_s=round(trained / max(train_seconds, 1e-9)),
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
