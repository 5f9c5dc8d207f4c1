"""Lesson 10: the transformer on a 3-D mesh: a pipeline (pp) of tp x FSDP2 (dp) stages.

    make lesson10-3d NPROC=8                            # prints, then runs, this command:
    torchrun --nproc-per-node=8 scripts/lesson10_3d.py

The W ranks form a dp x tp grid (--tp: 2 when W is even, else 1). Within a row, the "tp"
group, every block is cut by tensor parallelism: q, k, v and the MLP's up by columns (each
rank computes one head, half the hidden features), out and down by rows, their partial sums
all-reduced. Along a column, the "dp" group, every block is an FSDP unit whose (tp) pieces are
sharded once more. The data is split over dp only: the tp ranks of a row read the same batch.
Each cell of the grid is a pipeline of --pp ranks (2 when W / tp is even, else 1), GPipe over the
transformer's pieces, as the pipeline step cuts them. So W=8 (2 x 2 x 2) trains DDP's weights on 2:
    diff scripts/lesson10_fsdp_tp.py scripts/lesson10_3d.py
"""

import copy
import logging
import math
import os
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
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
    parser.add_argument("--tp", type=int, default=None,
                        help="ranks of a tensor-parallel group (default: 2 if W is even, else 1)")
    parser.add_argument("--pp", type=int, help="pipeline stages (2 if W / tp is even, else 1)")
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
def evaluate(model, loader, device, batches):
    """[correct predictions, samples seen] over `loader`, as a tensor on `device`, after
    `batches` forwards, as many on every rank (a sharded model's forwards are collectives)."""
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
    timeout = timedelta(seconds=args.timeout)
    dist.init_process_group(backend, timeout=timeout)
    tp = args.tp or (2 if world_size % 2 == 0 else 1)
    if tp < 1 or world_size % tp or 2 % tp:  # 2 heads: one or two per rank
        fail(f"--tp {tp} must divide the {world_size} rank(s) and the 2 attention heads")
    pp = args.pp or 2 - world_size // tp % 2
    if pp not in range(1, 5) or world_size // tp % pp or args.micro_batches < 1:
        fail(f"--pp {pp} must divide W / tp = {world_size // tp} and be <= 4; --micro-batches >= 1")
    dp = world_size // tp // pp
    # The mesh's groups made here, each with the timeout (init_device_mesh would give them
    # the backend's default: 30 minutes for gloo). Every rank makes every group, in order.
    grid = torch.arange(world_size).reshape(pp, dp, tp)  # rank = (stage x dp + row) x tp + column
    row, _ = dist.new_subgroups_by_enumeration(grid.reshape(-1, tp).tolist(), timeout=timeout)
    column, _ = dist.new_subgroups_by_enumeration(grid.mT.reshape(-1, dp).tolist(), timeout=timeout)
    pipe, _ = dist.new_subgroups_by_enumeration(grid.reshape(pp, -1).T.tolist(), timeout=timeout)
    mesh = DeviceMesh.from_group([pipe, column, row], device.type, mesh=grid,
                                 mesh_dim_names=("pp", "dp", "tp"))
    dp_rank = mesh.get_local_rank("dp")  # this rank's row: the tp ranks of a row share it

    # The global batch stays what it was on one device; each ROW (dp rank) takes a share.
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
    # Validation: every dp-th image, no sampler padding: each one counted once per row.
    val_loader = DataLoader(Subset(val_set, range(dp_rank, len(val_set), dp)),
                            batch_size=batch_size)
    val_batches = math.ceil(len(range(0, len(val_set), dp)) / batch_size)  # row 0's

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = Transformer(args.image_size, args.width, NUM_CLASSES[args.dataset]).to(device)
    pp_rank = mesh.get_local_rank("pp")
    stage = stage_of(model, pp_rank, pp)  # this rank's stage (the plain model validates)
    # Tensor parallelism first, on "tp" (each rank keeps its columns or rows of the seeded
    # weights), then fully_shard on "dp": every block a unit, the rest in the root unit.
    for block in [block for block in stage.blocks if isinstance(block, Block)]:
        parallelize_module(block, mesh["tp"], {
            "q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
            "out": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(stage, mesh=mesh["dp"])
    schedule = ScheduleGPipe(  # on "pp"; FSDP reduce-scatters after the last micro-batch only
        PipelineStage(stage, pp_rank, pp, device, group=pipe), args.micro_batches,
        partial(F.cross_entropy, reduction="sum"), scale_grads=False)  # a summed loss: below
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(stage.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    # Validation gathers weights cut twice (two all_gathers): DTensor warns it is "suboptimal"
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

    parameters = sum(p.numel() for p in model.parameters())
    if rank == 0:  # rank 0 speaks for the job
        print(f"a transformer ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
              f"{len(train_set)} training and {len(val_set)} validation images, "
              f"{world_size} process(es) on {device.type} with {backend}")
        print(f"{pp} x {dp} x {tp} (pp x dp x tp): global batch {args.batch_size} = {dp} row(s) x "
              f"{batch_size}, "
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
            samples = len(labels)  # then padded to `size`, as the pipeline step pads
            images = F.pad(images.to(device), (0, 0) * 3 + (0, size - samples))  # last dim first
            labels = F.pad(labels.to(device), (0, size - samples), value=-100)
            optimizer.zero_grad(set_to_none=True)
            logits = schedule.step(*[images] if pp_rank == 0 else [], target=labels)
            for p in stage.parameters():  # FSDP averaged the rows' gradients of summed losses:
                p.grad /= samples  # divided by a row's samples, the mean loss's gradient
            optimizer.step()
            if pp_rank < pp - 1:  # only the last stage has the logits
                continue
            stats[0] += F.cross_entropy(logits.detach(), labels, reduction="sum")  # no graph kept
            stats[1] += (logits.argmax(1) == labels).sum()
            stats[2] += samples
        dist.all_reduce(stats, group=mesh.get_group("dp"))  # over rows: the whole epoch
        dist.all_reduce(stats, group=pipe)  # and from the last stage to every stage
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        train_seconds += time.perf_counter() - tick
        trained += int(seen)

        every = [None] * world_size  # validation on the plain model: every stage, whole, to all
        dist.all_gather_object(every, {k: v.cpu() for k, v in get_model_state_dict(
            stage, options=StateDictOptions(full_state_dict=True)).items()})
        model.load_state_dict({k: v for weights in every for k, v in weights.items()})
        counts = evaluate(model, val_loader, device, val_batches)
        dist.all_reduce(counts, group=mesh.get_group("dp"))  # summed over the rows' shards
        val_correct, val_seen = counts.tolist()
        train_loss, val_acc = loss_sum / seen, val_correct / val_seen
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  "
                  f"train acc {correct / seen:.3f}  val acc {val_acc:.3f} "
                  f"({int(val_seen)} images)  {time.perf_counter() - tick:.1f} s")

    if rank == 0:  # one checkpoint, written once
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
