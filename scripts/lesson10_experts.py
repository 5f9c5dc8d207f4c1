"""Lesson 10: the transformer with expert parallelism: each MLP, experts spread over the ranks.

    make lesson10-experts NPROC=3                       # prints, then runs, this command:
    torchrun --nproc-per-node=3 scripts/lesson10_experts.py

Each token goes to one of E small MLPs (--experts), picked and weighted by a router. Expert e
lives on rank e W // E (none if W > E): any W runs the same model. Every rank builds all E,
trains its own; all_to_all takes tokens there and back. The weights of one process at any W
whose DistributedSampler pads the data as one process's does (W = 2; lesson 3's padding):
    diff scripts/lesson10_transformer.py scripts/lesson10_experts.py
"""

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
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
    parser.add_argument("--experts", type=int, default=8, help="experts in each block")
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
    if args.epochs < 0 or args.batch_size is not None and args.batch_size < 1 or args.experts < 1:
        parser.error("--epochs must be >= 0, --batch-size and --experts >= 1")
    return args


class AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; in backward the rows' gradients go back home."""

    @staticmethod
    def forward(ctx, rows, receive, send):
        ctx.splits = send, receive
        received = rows.new_empty(sum(receive), rows.shape[1])
        dist.all_to_all_single(received, rows.contiguous(), receive, send)
        return received

    @staticmethod
    def backward(ctx, grad):
        return AllToAll.apply(grad, *ctx.splits), None, None


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)): a pre-norm transformer block."""

    def __init__(self, width: int, experts: int, heads: int = 2):
        super().__init__()
        self.head_width = width // heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, width)
        self.router, self.experts = nn.Linear(width, experts), nn.ModuleList(  # the MLP, E times
            nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
            for _ in range(experts))

    def forward(self, x):
        batch, tokens, _ = x.shape
        h = self.norm1(x)
        # (batch, heads, tokens, head_width); -1: the heads there are (fewer if q is split)
        q, k, v = (f(h).view(batch, tokens, -1, self.head_width).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        attended = F.scaled_dot_product_attention(q, k, v)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, tokens, -1))
        return x + self.mixture(self.norm2(x))

    def mixture(self, h):  # each token through its expert, wherever that lives
        tokens, world, n = h.reshape(-1, h.shape[-1]), dist.get_world_size(), len(self.experts)
        probability, expert = self.router(tokens).softmax(-1).max(-1)
        owner = torch.arange(n, device=h.device) * world // n  # expert e's rank: e W // E
        mine = (owner == dist.get_rank()).nonzero().flatten()  # this rank's experts
        order = expert.argsort(stable=True)  # rows grouped by expert, so by the expert's rank
        send = torch.bincount(owner[expert], minlength=world).tolist()  # rows to each rank
        # First the counts, so each rank knows what it will receive: per source, per my expert.
        counts = tokens.new_empty(world * len(mine), dtype=torch.long)
        dist.all_to_all_single(counts, torch.bincount(expert, minlength=n),
                               [len(mine)] * world, torch.bincount(owner, minlength=world).tolist())
        receive = counts.view(world, len(mine)).sum(1).tolist()
        rows = AllToAll.apply(tokens[order], receive, send)  # by source rank, then by expert
        expert_of_row = mine.repeat(world).repeat_interleave(counts)
        done = rows.clone()  # overwritten below; cloned, not zeroed: every rank joins backward
        for e in mine.tolist():
            done[expert_of_row == e] = self.experts[e](rows[expert_of_row == e])
        back = AllToAll.apply(done, send, receive)[order.argsort()]  # the token order again
        return (back * probability[:, None]).view_as(h)


class Transformer(nn.Module):
    """An image's rows as tokens: embed, add positions, 2 blocks, average, classify."""

    def __init__(self, side: int, width: int, classes: int, experts: int, blocks: int = 2):
        super().__init__()
        self.embed = nn.Linear(side, width)
        self.positions = nn.Parameter(torch.randn(side, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, experts) for _ in range(blocks))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, images):
        x = self.embed(images[:, 0]) + self.positions  # one channel: rows of pixels
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(1))


@torch.no_grad()
def evaluate(model, loader, device, batches):
    """[correct predictions, samples seen] over `loader`, as a tensor on `device`."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # summed on the device
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        counts[0] += (model(images).argmax(1) == labels).sum()
        counts[1] += len(labels)
    for _ in range(batches - len(loader)):  # the others' all_to_alls need it: not counted
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
    val_batches = len(range(0, len(val_set), world_size * batch_size))  # rank 0's, the most

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = Transformer(args.image_size, args.width, NUM_CLASSES[args.dataset], args.experts)
    model = model.to(device)  # every rank the same weights, from the seed: no broadcast needed
    # Not DDP, which would average the experts' gradients too: the rest's, summed by hand.
    shared = [p for name, p in model.named_parameters() if ".experts." not in name]
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)

    parameters = sum(p.numel() for p in model.parameters())
    if rank == 0:  # rank 0 speaks for the job
        print(f"a transformer ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
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
            # Each rank's share of the global batch's mean loss: its experts' gradients, which
            # the all_to_all's backward brings from every rank's tokens, add up to the global one;
            (loss / world_size).backward()
            for weight in shared:  # the replicated weights' gradients need that sum too
                dist.all_reduce(weight.grad)
            optimizer.step()
            stats[0] += loss.detach() * len(labels)  # detach: no graph across the epoch
            stats[1] += (logits.argmax(1) == labels).sum()
            stats[2] += len(labels)
        dist.all_reduce(stats)  # sums over ranks: the loss and accuracy of the whole epoch
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        train_seconds += time.perf_counter() - tick
        trained += int(seen)

        counts = evaluate(model, val_loader, device, val_batches)
        dist.all_reduce(counts)  # correct and seen, summed over the ranks' shards
        val_correct, val_seen = counts.tolist()
        train_loss, val_acc = loss_sum / seen, val_correct / val_seen
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  "
                  f"train acc {correct / seen:.3f}  val acc {val_acc:.3f} "
                  f"({int(val_seen)} images)  {time.perf_counter() - tick:.1f} s")

    for block in model.blocks:  # each expert's weights from the rank that trained them
        for e, expert in enumerate(block.experts):
            for weight in expert.parameters():
                dist.broadcast(weight.detach(), src=e * world_size // args.experts)
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
