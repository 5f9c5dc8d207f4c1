"""Lesson 7 experiment: torch.compile and DDP: what is compiled, where the graph is cut.

    make lesson7-compile NPROC=2
    torchrun --nproc-per-node=2 scripts/experiments/lesson7_compile.py [--bucket-caps 25,1,0.5]

Each rank trains the same starting model on the same samples several ways and rank 0
prints one row per way:

    eager                              DDP(model), nothing compiled: the reference
    torch.compile(DDP(nn.Sequential))  the wrapper compiled around a bare nn.Sequential
    torch.compile(DDP(model))          the wrapper compiled, the model a class of its own
    ddp.module.compile()               DDP(model), then the model compiled in place
    (the last two once per bucket size given)

    graphs       how many graphs the compiler was handed (a backend that counts them, then
                 calls inductor, torch.compile's default back end)
    first step   the first step, in s: for a compiled way, mostly compiling
    ms/step      the median step after the first
    max |diff|   the weights after the last step against the eager way's, over every rank

Under DDP the compiler cuts the model's graph where its estimate of DDP's buckets ends
(torch._dynamo's "DDP optimizer", torch/_dynamo/backends/distributed.py), so each bucket's
all-reduce can start while the graphs before it still run backward: the smaller
bucket_cap_mb, the more graphs. The DDP optimizer's first bucket is always 1 MiB
(torch.distributed._DEFAULT_FIRST_BUCKET_BYTES), so a cap below 1 MiB is refused ("First
bucket should be smaller/equal to other buckets"), though DDP itself accepts it; the row says
so. Inductor needs a C++ compiler on the CPU (g++).
"""

import copy
import os
import shutil
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# inductor, torch.compile's default back end, called by the graph-counting backend below: the
# public API names a backend only by its string, and a string cannot count graphs
from torch._inductor.compile_fx import compile_fx
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DistributedSampler

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import NUM_CLASSES, load_datasets
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import (
    end_with_rank_0s_verdict,
    fail,
    pick_device,
    world_of_one_unless_launched,
)


class GraphCounter:
    """A torch.compile backend that counts the graphs it is handed, then compiles each with
    inductor, as torch.compile's default backend does."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return compile_fx(graph_module, example_inputs)


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket-caps", default="25,1,0.5",
                        help="DDP's bucket_cap_mb values to try, comma-separated")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per way")
    parser.add_argument("--batch", type=int, default=32, help="samples per step per process")
    parser.add_argument("--width", type=int, default=512, help="the MLP's hidden width")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds a collective may wait for the other processes (the "
                             "first compiled step waits for the slowest rank's compiling)")
    args = parser.parse_args()
    try:
        args.caps = [float(c) for c in args.bucket_caps.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--bucket-caps {args.bucket_caps!r}: give numbers, e.g. 25,1")
    if not args.caps or min(args.caps) <= 0 or min(args.steps, args.batch, args.width) < 2:
        parser.error("--bucket-caps must be positive; --steps, --batch and --width at least 2")
    return args


class MLP(nn.Module):
    """Layers of about 1 MB each (width 512), so that DDP's buckets cut the model; its own
    forward, as a model you write has."""

    def __init__(self, width: int):
        super().__init__()
        hidden = [layer for _ in range(4) for layer in (nn.Linear(width, width), nn.ReLU())]
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, width), nn.ReLU(),
                                    *hidden, nn.Linear(width, NUM_CLASSES["digits"]))

    def forward(self, images):
        return self.layers(images)


EAGER, WRAPPER, BARE, INSIDE = ("eager", "torch.compile(DDP(model))",
                                "torch.compile(DDP(nn.Sequential))", "ddp.module.compile()")


def train(start, batches, cap, way, backend, lr, device):
    """(final weights, seconds per step) of DDP(start) trained on `batches`, compiled `way`
    (BARE: the same layers as a bare nn.Sequential, without the MLP's own forward)."""
    layers = copy.deepcopy(start.layers if way == BARE else start)
    model = DDP(layers, bucket_cap_mb=cap,
                device_ids=[device.index] if device.type == "cuda" else None)
    step_model = model
    if way in (WRAPPER, BARE):
        step_model = torch.compile(model, backend=backend)
    elif way == INSIDE:
        model.module.compile(backend=backend)  # in place: DDP calls the compiled model
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    seconds = []
    for images, labels in batches:
        tick = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(step_model(images.to(device)), labels.to(device)).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - tick)
    return torch.cat([p.detach().flatten() for p in model.module.parameters()]), seconds


def median_ms(seconds):
    rest = sorted(seconds[1:])
    return f"{1e3 * rest[len(rest) // 2]:.2f}"


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device, backend = pick_device(int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    if device.type == "cpu" and shutil.which(os.environ.get("CXX", "g++")) is None:
        fail("torch.compile's CPU back end (inductor) needs a C++ compiler: install g++ "
             "(Debian and Ubuntu: apt-get install g++)")
    train_set, _ = load_datasets("digits")
    if args.steps * args.batch * world_size > len(train_set):
        fail(f"{args.steps} steps of {world_size} x {args.batch} samples need more than the "
             f"{len(train_set)} training images; take fewer steps or smaller batches")
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    batches = []
    for indices in list(BatchSampler(sampler, args.batch, drop_last=True))[:args.steps]:
        images, labels = zip(*(train_set[i] for i in indices), strict=True)
        batches.append((torch.stack(images), torch.stack(labels)))
    torch.manual_seed(args.seed)
    start = MLP(args.width).to(device)
    megabytes = sum(p.numel() * p.element_size() for p in start.parameters()) / 2**20

    runs = [(EAGER, args.caps[0]), (BARE, args.caps[0]),
            *((way, cap) for cap in args.caps for way in (WRAPPER, INSIDE))]
    rows, worst, failed, reference = [], 0.0, False, None
    for way, cap in runs:
        torch.compiler.reset()  # each compiled way compiles afresh
        counter = GraphCounter()
        try:
            weights, seconds = train(start, batches, cap, way, counter, args.lr, device)
        except Exception as error:  # the compiler's refusal, raised by the compiled step
            said = str(error).strip().splitlines()[-1]
            rows.append({"way": way, "bucket_cap_mb": f"{cap:g}", "graphs": "-",
                         "first step s": "-", "ms/step": "-",
                         "max |diff|": f"refused: {said[:100]}"})
            continue
        reference = weights if reference is None else reference
        diff = torch.tensor([(weights - reference).abs().max().item()], device=device)
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        worst = max(worst, diff.item())
        rows.append({"way": way, "bucket_cap_mb": f"{cap:g}",
                     "graphs": counter.graphs if way != EAGER else "-",
                     "first step s": f"{seconds[0]:.2f}", "ms/step": median_ms(seconds),
                     "max |diff|": f"{diff.item():.1e}"})
    if rank == 0:
        print(f"an MLP of {megabytes:.2f} MB of weights, {world_size} process(es), "
              f"{args.steps} steps of {args.batch} samples each, {device.type}/{backend}")
        print(format_table(rows))
        compiled = {(row["way"], row["bucket_cap_mb"]): row["graphs"] for row in rows
                    if row["way"] in (WRAPPER, INSIDE) and isinstance(row["graphs"], int)}
        failed = worst > args.tolerance or not compiled or min(compiled.values()) < 1
        bare = next(row for row in rows if row["way"] == BARE)
        print(f"check: every compiled way {'matches' if not failed else 'DOES NOT match'} "
              f"the eager weights within {args.tolerance:g} (largest difference {worst:.1e}); "
              f"the model's own class compiled both ways, a bare nn.Sequential under "
              f"torch.compile(DDP(...)) handed the compiler {bare['graphs']} graph(s)")
        print(summary_line(world_size=world_size, bucket_caps=args.bucket_caps,
                           graphs_bare=bare["graphs"],
                           graphs_wrapper=",".join(str(row["graphs"]) for row in rows
                                                   if row["way"] == WRAPPER),
                           graphs_inside=",".join(str(row["graphs"]) for row in rows
                                                  if row["way"] == INSIDE),
                           refused=sum(row["graphs"] == "-" and row["way"] != EAGER
                                       for row in rows),
                           max_diff=f"{worst:.1e}", equivalent="no" if failed else "yes",
                           wall_s=round(time.perf_counter() - started, 2)))
    end_with_rank_0s_verdict(failed, device)


if __name__ == "__main__":
    main()
