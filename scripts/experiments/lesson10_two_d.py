"""Lesson 10 experiment: two dimensions at once: FSDP2 x tensor parallelism on a dp x tp mesh,
and HSDP on a replicate x shard mesh, each trained equal to one process, every collective
counted per mesh dimension beside the prediction.

    make lesson10-two-d NPROC=4                         # prints, then runs, this command:
    torchrun --nproc-per-node=4 scripts/experiments/lesson10_two_d.py

A stack of transformer-style MLP blocks, x + down(gelu(up(norm(x)))), and a final LayerNorm,
trains for a few Adam steps three ways from the same weights on the same global batch:
(a) FSDP x TP, on the mesh of make lesson10-mesh: within a row (the "tp" group) the blocks are
    split by tensor parallelism (up by columns, down by rows, as in lesson 8); along a column
    (the "dp" group) every block is an FSDP unit, its pieces sharded once more. The data is
    split over dp only: the two tp ranks of a row see the same samples;
(b) HSDP (hybrid sharding): fully_shard on a 2-D mesh (replicate, shard). Each row shards the
    whole model as FSDP does; the rows are replicas of each other, like DDP's. The data is
    split over all W ranks;
(c) the reference: the same model in one process on the whole global batch.
Then every parameter of (a) and (b), put together whole (full_tensor()), is compared with (c).
A TorchDispatchMode sees every c10d operator a rank calls during a training step, the
gradients' reduce-scatters in backward included (on the CPU, backward runs in this thread):
its kind, the bytes of the whole tensor it handles (an all_gather's output, a
reduce_scatter's input, an all_reduce's tensor) and the ranks of its group, hence its mesh
dimension. The prediction comes from the parameters' shapes alone:
- FSDP: per unit, one all_gather of its parameters (this rank's tensor-parallel pieces, each
  padded to a multiple of the dp size along its first dimension, as FSDPParam pads) before
  forward, again before backward (units resharded after forward: all but the root, see
  below), and one reduce_scatter of the same size for the gradients;
- TP: per block one all_reduce of the activations (local batch x seq x features) after the
  row-split linear in forward, and one of the gradient of the column-split linear's input in
  backward (each rank has a partial sum of it, from its own columns);
- HSDP: FSDP's all_gather and reduce_scatter within a row, then an all_reduce across the
  rows (replicate) of each unit's reduce-scattered piece: units x its size / shard.
"""

import copy
import logging
import math
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

# A dispatch mode sees every operator a thread calls, the c10d ones included: torch has no
# public home for its base class.
from torch.utils._python_dispatch import TorchDispatchMode

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import (
    end_with_rank_0s_verdict,
    fail,
    pick_device,
    world_of_one_unless_launched,
)
from ddpcourse.scripts import import_script

grid, mesh_groups = import_script("experiments/lesson10_mesh", "grid", "mesh_groups")

FLOAT_BYTES = 4  # float32 everywhere


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2,
                        help="size of the last mesh dimension: tp in (a), shard in (b)")
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--features", type=int, default=16, help="a token's features")
    parser.add_argument("--hidden", type=int, default=64, help="features inside a block")
    parser.add_argument("--seq", type=int, default=8, help="tokens per sample")
    parser.add_argument("--batch-size", type=int, default=24,
                        help="the global batch, split over the data-parallel ranks")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam's learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest difference from one process that counts as equal")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if min(args.blocks, args.features, args.hidden, args.seq, args.batch_size, args.steps) < 1:
        parser.error("--blocks, --features, --hidden, --seq, --batch-size and --steps must be "
                     "at least 1")
    if args.tp < 2:
        parser.error("--tp must be at least 2")
    return args


class Block(nn.Module):
    """A transformer's MLP half: x + down(gelu(up(norm(x))))."""

    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        self.up = nn.Linear(features, hidden)
        self.down = nn.Linear(hidden, features)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, blocks: int, features: int, hidden: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(features, hidden) for _ in range(blocks))
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


# --- counting collectives --------------------------------------------------------------------

NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
NOT_COLLECTIVES = {"barrier", "monitored_barrier_", "wait_tensor", "_wrap_tensor_autograd",
                   "check_for_nan"}
# Which argument holds the whole tensor: an all_gather's output, a reduce_scatter's input.
KINDS = {"allreduce_": ("all_reduce", 0), "all_reduce": ("all_reduce", 0),
         "_allgather_base_": ("all_gather", 0), "allgather_": ("all_gather", 0),
         "all_gather_into_tensor": ("all_gather", 0),  # its input: x group size below
         "_reduce_scatter_base_": ("reduce_scatter", 1), "reduce_scatter_": ("reduce_scatter", 1),
         "reduce_scatter_tensor": ("reduce_scatter", 0), "broadcast_": ("broadcast", 0),
         "alltoall_base_": ("all_to_all", 1), "all_to_all_single": ("all_to_all", 0)}


def tensors_in(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


def group_of(args, kwargs, groups: dict[str, str]) -> str:
    """The mesh dimension of the group a c10d operator runs on, from its arguments: a
    ProcessGroup (c10d's ops, which FSDP calls) or a group's name (the functional collectives
    DTensor calls). `groups` maps group names to dimensions; another group is named by its
    ranks."""
    for value in (*args, *(kwargs or {}).values()):
        if isinstance(value, torch.ScriptObject):  # a ProcessGroup, boxed for the dispatcher
            group = dist.ProcessGroup.unbox(value)
            return groups.get(group.group_name, "ranks " + ",".join(
                map(str, dist.get_process_group_ranks(group))))
        if isinstance(value, str) and value in groups:
            return groups[value]
    return "another group"


class Collectives(TorchDispatchMode):
    """Inside `with Collectives(groups) as seen:`, seen.calls fills with (kind, dimension,
    bytes) for every collective this thread starts, whoever starts it (FSDP, DTensor, us).
    `groups`: {dimension: its group} for this rank, e.g. {"dp": mesh.get_group("dp"), ...}."""

    def __init__(self, groups: dict):
        super().__init__()
        self.groups = {group.group_name: name for name, group in groups.items()}
        self.sizes = {name: group.size() for name, group in groups.items()}
        self.calls: list[tuple[str, str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, op = func.name().partition("::")
        if namespace in NAMESPACES and op not in NOT_COLLECTIVES:
            kind, where = KINDS.get(op, (op.strip("_"), 0))
            dimension = group_of(args, kwargs, self.groups)
            size = sum(t.numel() * t.element_size() for t in tensors_in(args[where]))
            if op == "all_gather_into_tensor":  # its input is this rank's piece
                size *= self.sizes.get(dimension, 0)
            self.calls.append((kind, dimension, size))
        return func(*args, **(kwargs or {}))


def by_dimension(calls) -> dict:
    """{(kind, dimension): [count, bytes]}."""
    counted = {}
    for kind, dimension, size in calls:
        seen = counted.setdefault((kind, dimension), [0, 0])
        seen[0] += 1
        seen[1] += size
    return counted


# --- the prediction --------------------------------------------------------------------------

def padded(shape, ranks: int) -> int:
    """Numbers FSDP keeps for a parameter of `shape` over `ranks`: torch.chunk along the first
    dimension, every piece padded to the first one's size ("0th always padded")."""
    return math.ceil(shape[0] / ranks) * ranks * math.prod(shape[1:])


def unit_sizes(model: Stack, tp: int, ranks: int, split: bool) -> list[int]:
    """The numbers each FSDP unit all-gathers (blocks first, the root last): every parameter
    padded over `ranks`; with `split`, this rank's tensor-parallel piece of up and down."""
    sizes = []
    for block in model.blocks:
        shapes = [p.shape for p in block.norm.parameters()]
        if split:  # up by columns: rows of weight and bias / tp; down by rows: weight's columns
            up, down = block.up, block.down
            shapes += [(up.out_features // tp, up.in_features), (up.out_features // tp,),
                       (down.out_features, down.in_features // tp), (down.out_features,)]
        else:
            shapes += [p.shape for p in (*block.up.parameters(), *block.down.parameters())]
        sizes.append(sum(padded(s, ranks) for s in shapes))
    sizes.append(sum(padded(p.shape, ranks) for p in model.norm.parameters()))
    return sizes


def predict(setup: str, model: Stack, args, dp: int, tp: int) -> dict:
    """{(kind, dimension): [count, bytes, why]} of one training step, from the shapes alone."""
    blocks = len(model.blocks)
    units = blocks + 1  # every block, and the root (the final norm)
    # The root unit is not resharded after forward (FSDPState._lazy_init in _fsdp_state.py:
    # backward would gather it again at once), so backward gathers the blocks only.
    gathers = f"{units} units forward + {blocks} backward (the root stays gathered)"
    if setup == "fsdp x tp":
        sizes = unit_sizes(model, tp, dp, split=True)
        activations = args.batch_size // dp * args.seq * args.features  # one block's output
        return {("all_gather", "dp"): [2 * units - 1, (sum(sizes) + sum(sizes[:-1]))
                                       * FLOAT_BYTES, gathers + "; tp pieces"],
                ("reduce_scatter", "dp"): [units, sum(sizes) * FLOAT_BYTES,
                                           "the gradients, one per unit"],
                ("all_reduce", "tp"): [2 * blocks, 2 * blocks * activations * FLOAT_BYTES,
                                       "per block: down's output forward, up's input "
                                       "gradient backward"]}
    sizes = unit_sizes(model, tp, tp, split=False)  # HSDP: shard over the last dimension
    return {("all_gather", "shard"): [2 * units - 1, (sum(sizes) + sum(sizes[:-1]))
                                      * FLOAT_BYTES, gathers],
            ("reduce_scatter", "shard"): [units, sum(sizes) * FLOAT_BYTES,
                                          "the gradients, one per unit"],
            ("all_reduce", "replicate"): [units, sum(sizes) // tp * FLOAT_BYTES,
                                          "each unit's reduce-scattered piece, across rows"]}


# --- training --------------------------------------------------------------------------------

def train(model, optimizer, batches, groups: dict):
    """Adam steps on `batches`; this rank's losses and the collectives of each step."""
    losses, steps = [], []
    for x, target in batches:
        with Collectives(groups) as seen:
            loss = F.mse_loss(model(x), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
        steps.append(seen.calls)
    return losses, steps


def whole(model) -> list[torch.Tensor]:
    """Every parameter whole (a DTensor's pieces gathered: collectives, outside the count).

    Under FSDP x TP, up's weight is (_StridedShard(dim=0, sf=tp), Shard(dim=0)): both
    dimensions cut its rows, tp first. DTensor then gathers it in two all_gathers and warns,
    once per rank, that this is "suboptimal" (tensor/_redistribute.py): true, and beside the
    point here, so that one logger is quietened while we gather.
    """
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
                for p in model.parameters()]
    finally:
        logger.setLevel(level)


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dp, tp = grid(world_size, args.tp)  # a 2-D mesh or a one-line refusal
    for what, value, ranks in (("--batch-size", args.batch_size, world_size),
                               ("--hidden", args.hidden, tp)):
        if value % ranks:
            fail(f"{what} {value} does not split evenly over {ranks} ranks; use a multiple "
                 f"of {ranks}")
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=args.timeout)
    dist.init_process_group(backend, timeout=timeout)

    # The same global batches on every rank (a seeded generator), and the same first weights.
    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.batch_size, args.seq, args.features)
    batches = [(torch.randn(shape, generator=generator).to(device),
                torch.randn(shape, generator=generator).to(device)) for _ in range(args.steps)]
    torch.manual_seed(args.seed)
    first = Stack(args.blocks, args.features, args.hidden).to(device)

    # (c) one process, the whole batch: what the others must equal
    reference = copy.deepcopy(first)
    reference_losses, _ = train(reference, torch.optim.Adam(reference.parameters(), lr=args.lr),
                                batches, {})
    expected = [p.detach() for p in reference.parameters()]

    results = {}
    # (a) FSDP x TP. Tensor parallelism first (it replaces parameters by DTensors on "tp"),
    # then fully_shard on "dp", each block a unit, the final norm in the root unit.
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"),
                            backend_override=mesh_groups(("dp", "tp"), backend, timeout))
    model = copy.deepcopy(first)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    share = args.batch_size // dp
    mine = mesh.get_local_rank("dp")  # the tp ranks of a row share a dp coordinate: same data
    results["fsdp x tp"] = (mesh, model, [(x[mine * share:(mine + 1) * share],
                                           y[mine * share:(mine + 1) * share])
                                          for x, y in batches])

    # (b) HSDP: one fully_shard call on a 2-D mesh; data split over all ranks.
    hybrid = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("replicate", "shard"),
                              backend_override=mesh_groups(("replicate", "shard"), backend,
                                                           timeout))
    model = copy.deepcopy(first)
    for block in model.blocks:
        fully_shard(block, mesh=hybrid)
    fully_shard(model, mesh=hybrid)
    share = args.batch_size // world_size
    results["hsdp"] = (hybrid, model, [(x[rank * share:(rank + 1) * share],
                                        y[rank * share:(rank + 1) * share]) for x, y in batches])

    report = {}
    for setup, (on, model, mine) in results.items():
        groups = {name: on.get_group(name) for name in on.mesh_dim_names}
        losses, steps = train(model, torch.optim.Adam(model.parameters(), lr=args.lr), mine,
                              groups)
        counted = [by_dimension(calls) for calls in steps]
        difference = max((p - q).abs().max().item()
                         for p, q in zip(whole(model), expected, strict=True))
        # The global batch's loss: the mean over the ranks (a tp rank repeats its row's loss,
        # which leaves the mean as it is).
        loss = torch.tensor(losses, dtype=torch.float64, device=device)
        dist.all_reduce(loss)
        report[setup] = {"difference": difference, "counted": counted,
                         "losses": (loss / world_size).tolist()}
    every = [None] * world_size if rank == 0 else None
    dist.gather_object(report, every, dst=0)

    worst, agree = 0.0, True
    if rank == 0:
        print(f"{world_size} ranks on {device.type} with {backend}: a {dp} x {tp} mesh; "
              f"{args.blocks} blocks ({args.features} -> {args.hidden} -> {args.features}), "
              f"global batch {args.batch_size} x {args.seq} tokens, {args.steps} Adam steps")
        rows = []
        for setup in results:
            predicted = predict(setup, first, args, dp, tp)
            seen = every[0][setup]["counted"][-1]  # the last step (all steps alike: checked)
            alike = all(r[setup]["counted"] == [seen] * args.steps for r in every)
            difference = max(r[setup]["difference"] for r in every)
            worst = max(worst, difference)
            for key in sorted(set(predicted) | set(seen)):
                want = predicted.get(key, [0, 0, "not predicted"])
                got = seen.get(key, [0, 0])
                same = want[:2] == got and alike
                agree &= same
                rows.append({"setup": setup, "collective": key[0], "dimension": key[1],
                             "predicted": want[0], "measured": got[0],
                             "predicted bytes": want[1], "measured bytes": got[1],
                             "check": "same" if same else "DIFFERENT", "why": want[2]})
            losses = " ".join(f"{x:.6f}" for x in every[0][setup]["losses"])
            print(f"{setup}: losses {losses}; largest parameter difference from one process "
                  f"{difference:.1e}; every rank and step counted alike: {alike}")
        print(f"one process:  losses {' '.join(f'{x:.6f}' for x in reference_losses)}")
        print("\ncollectives of one training step, per rank (bytes: the whole tensor)")
        print(format_table(rows))
        same = worst <= args.tolerance
        print(f"check: both setups {'equal' if same else 'DO NOT equal'} one process (largest "
              f"difference {worst:.1e}, tolerance {args.tolerance:g}); collectives "
              f"{'as predicted' if agree else 'NOT as predicted'}")
        print(summary_line(world_size=world_size, mesh=f"{dp}x{tp}", max_diff=worst,
                           same_as_one_process=same, collectives_as_predicted=agree,
                           backend=backend, wall_s=round(time.perf_counter() - started, 2)))
    end_with_rank_0s_verdict(rank == 0 and (worst > args.tolerance or not agree), device)


if __name__ == "__main__":
    main()
