"""Lesson 10 experiment: three dimensions at once: a pipeline of FSDP2 x tensor-parallel stages
on a pp x dp x tp mesh, trained equal to one process, each dimension's traffic and every rank's
memory beside the prediction.

    make lesson10-three-d NPROC=8                       # prints, then runs, this command:
    torchrun --nproc-per-node=8 scripts/experiments/lesson10_three_d.py

W = pp x dp x tp ranks, written row-major into a 3-D mesh (make lesson10-mesh): rank = pp_c x
dp x tp + dp_c x tp + tp_c, so at W = 8 ranks 0-3 hold stage 0 and ranks 4-7 stage 1; within a
stage, a 2 x 2 grid of dp rows and tp columns, as in the 2-D experiment. The model is a small
transformer without embeddings: --blocks blocks of x + attention(norm(x)) (--heads heads, causal)
and x + down(gelu(up(norm(x)))), then a final LayerNorm, trained on an MSE loss with Adam
(--optimizer sgd or sgd_momentum: plain SGD, or with momentum 0.9).
- pp: the blocks are cut into pp equal stages; torch.distributed.pipelining's PipelineStage
  (on the mesh's "pp" group) and ScheduleGPipe (lesson 8's schedule) move M = --micro-batches
  micro-batches through them: activations forward, their gradients back, by send/recv between
  the ranks of a "pp" group (same dp and tp coordinates, neighbouring stages). Every tp rank of
  a stage sends the whole activation to its own partner: tp copies of the same bytes
  (Megatron-LM's scatter/gather sends each a 1/tp piece and all_gathers them on arrival;
  pipelining sends what the stage returns);
- tp: inside a stage, each block's qkv projection and up are split by columns, out and down by
  rows (lesson 8, Megatron's layout): the heads are dealt to the tp ranks, so qkv's weight is
  laid out head after head (q, k, v of head 0, then of head 1, ...) and a column split gives a
  rank whole heads. One all_reduce per row-split linear forward, one per column-split linear's
  input gradient backward;
- dp: every block is an FSDP2 unit on the "dp" group (the stage's module the root unit, holding
  the final norm on the last stage), the tensor-parallel pieces sharded once more. The global
  batch is split over the dp rows; the tp ranks of a row, and the stages of a pipeline, see the
  same samples.
torch.distributed.pipelining composes with FSDP2 and TP as they are (2.14.1, CPU and gloo), so
no pipeline is written by hand: a stage's backward turns gradient sync off for every micro-batch
(stage.py, backward_maybe_with_nosync: set_requires_gradient_sync(False),
set_reshard_after_backward(False)) and reduce-scatters each unit once after the last one
(perform_reduce_grad), which also divides the gradients by M (the loss is a mean per
micro-batch). The stages are given their input and output shapes (static metadata: no forward
or backward runs to infer them); a stage's example input must require a gradient, except the
first's, or no gradient is sent back ("grad can be implicitly created only for scalar outputs"
on the stage before).
We check:
(a) after --steps optimizer steps, every parameter put together whole (full_tensor()) equals
    the same model trained in one process on the whole global batch (largest |difference|
    printed). Measured at W = 8: 1.8e-6 with Adam (lr 1e-3), 6e-8 with SGD (lr 0.1). Adam
    divides each gradient by its own running size, so where a gradient is ~1e-8 (a few of
    block 0's qkv weights) rounding that is relatively large there moves the weight by a
    visible part of lr: W = 6 --pp 1 --batch-size 12 is 2e-4 from one process with Adam,
    1.5e-8 with SGD, and one process alone, the same batch summed in 6 micro-batches, is
    already 1.9e-5 from its whole-batch self with Adam;
(b) every collective of a training step, caught by a TorchDispatchMode (the 2-D experiment's),
    by kind, count and bytes, per mesh dimension and per stage, against a prediction from the
    shapes alone (see predict_traffic), and the bytes each rank sends for it (a ring's
    all_reduce sends 2(g-1)/g of the tensor, all_gather and reduce_scatter (g-1)/g, lesson 4);
    the first step also carries the schedule's warm-up vote, one int32 each way per neighbour;
(c) the bytes of parameters, gradients and optimizer state each rank holds after the last
    step, against lesson 8's arithmetic (ddpcourse.sharding.predict) on this rank's
    tensor-parallel pieces sharded over dp, plus Adam's step counter (a float32 scalar per
    parameter tensor).
Any mesh that factors runs: --pp 1 (no pipeline) or W = 4 (pp, dp, tp) = (2, 1, 2); a dimension
of 1 is no parallelism at all (no FSDP, no TP, one stage). A world that does not factor, or
sizes that do not split, are refused in one line.
"""

import copy
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import (
    end_with_rank_0s_verdict,
    fail,
    pick_device,
    world_of_one_unless_launched,
)
from ddpcourse.scripts import import_script
from ddpcourse.sharding import OPTIMIZER_BUFFERS, held_bytes
from ddpcourse.sharding import predict as predict_memory

mesh_groups = import_script("experiments/lesson10_mesh", "mesh_groups")
Collectives, by_dimension, whole, padded = import_script(
    "experiments/lesson10_two_d", "Collectives", "by_dimension", "whole", "padded")

FLOAT_BYTES = 4  # float32 everywhere
VOTE_BYTES = 4   # the schedule's first-step vote: one int32
DIMENSIONS = ("pp", "dp", "tp")
OPTIMIZERS = ("adam", "sgd", "sgd_momentum")  # ddpcourse.sharding's names


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=2, help="pipeline stages (first dimension)")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks (last "
                                                          "dimension); dp is W / (pp x tp)")
    parser.add_argument("--blocks", type=int, default=4, help="transformer blocks in all")
    parser.add_argument("--features", type=int, default=16, help="a token's features")
    parser.add_argument("--heads", type=int, default=2, help="attention heads")
    parser.add_argument("--hidden", type=int, default=64, help="features inside the MLP")
    parser.add_argument("--seq", type=int, default=8, help="tokens per sample")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="the global batch, split over the dp rows, then into micro-batches")
    parser.add_argument("--micro-batches", type=int, default=2, help="M, per dp row and step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate (default 1e-3 for adam, 0.1 for sgd)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest difference from one process that counts as equal "
                             "(Adam magnifies rounding where a gradient is tiny: see the "
                             "script's docstring)")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.lr is None:
        args.lr = 1e-3 if args.optimizer == "adam" else 0.1
    if min(args.pp, args.tp, args.blocks, args.features, args.heads, args.hidden, args.seq,
           args.batch_size, args.micro_batches, args.steps) < 1:
        parser.error("--pp, --tp, --blocks, --features, --heads, --hidden, --seq, "
                     "--batch-size, --micro-batches and --steps must be at least 1")
    return args


def factor(world_size: int, args) -> tuple[int, int, int]:
    """(pp, dp, tp) for W ranks, or a one-line refusal, like every size that must split."""
    pp, tp = args.pp, args.tp
    if world_size % (pp * tp):
        fail(f"{world_size} rank(s) do not make a pp x dp x tp mesh with pp = {pp} and tp = "
             f"{tp}: W must be a multiple of {pp * tp} (e.g. {pp * tp} or {2 * pp * tp})")
    dp = world_size // (pp * tp)
    for what, value, parts in (("--blocks", args.blocks, pp), ("--heads", args.heads, tp),
                               ("--hidden", args.hidden, tp),
                               ("--features", args.features, args.heads),
                               ("--batch-size", args.batch_size, dp * args.micro_batches)):
        if value % parts:
            fail(f"{what} {value} does not split evenly into {parts}; use a multiple of {parts}")
    return pp, dp, tp


# --- the model -------------------------------------------------------------------------------

class Attention(nn.Module):
    """Causal multi-head self-attention. qkv's output is laid out head after head (q, k, v of
    one head together), so the heads of a rank's column piece are whole: the same code runs on
    the whole layer and on a tensor-parallel piece (it counts the heads it has)."""

    def __init__(self, features: int, heads: int):
        super().__init__()
        self.head_dim = features // heads
        # No bias on qkv: a key's bias adds the same number to every score of a query, which
        # softmax ignores, so its gradient is 0 in exact arithmetic and rounding noise in floats;
        # Adam divides a gradient by its own size, and turns each process's different noise into
        # a whole step of lr (9e-4 apart after 3 steps at lr 1e-2, measured). Llama has none.
        self.qkv = nn.Linear(features, 3 * features, bias=False)
        self.out = nn.Linear(features, features)

    def forward(self, x):
        batch, seq, _ = x.shape
        qkv = self.qkv(x)
        heads = qkv.shape[-1] // (3 * self.head_dim)  # all of them, or this rank's
        q, k, v = qkv.view(batch, seq, heads, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, seq, heads * self.head_dim))


class Block(nn.Module):
    def __init__(self, features: int, heads: int, hidden: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(features)
        self.attention = Attention(features, heads)
        self.norm2 = nn.LayerNorm(features)
        self.up = nn.Linear(features, hidden)
        self.down = nn.Linear(hidden, features)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Stage(nn.Module):
    """A run of blocks, and the final norm on the last stage; the whole model is one Stage."""

    @classmethod
    def cut(cls, model: "Stage", stage: int, stages: int) -> "Stage":
        """Pipeline stage `stage` of `stages` of the whole model (its modules, not copies)."""
        k = len(model.blocks) // stages
        return cls(model.blocks[stage * k:(stage + 1) * k],
                   model.norm if stage == stages - 1 else None)

    def __init__(self, blocks, norm=None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.norm = norm

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x if self.norm is None else self.norm(x)


TP_PLAN = {"attention.qkv": ColwiseParallel(), "attention.out": RowwiseParallel(),
           "up": ColwiseParallel(), "down": RowwiseParallel()}


def local_shapes(block: Block, tp: int) -> list[tuple[int, ...]]:
    """The shapes of a block's parameters on one tp rank, in the block's order: a column-split
    linear keeps 1/tp of its weight's rows and bias, a row-split one 1/tp of its weight's
    columns and all its bias."""
    shapes = []
    for name, p in block.named_parameters():
        module = name.rsplit(".", 1)[0]
        split = {ColwiseParallel: 0, RowwiseParallel: 1}.get(type(TP_PLAN.get(module)))
        shape = list(p.shape)
        if split is not None and split < len(shape):
            shape[split] //= tp
        shapes.append(tuple(shape))
    return shapes


# --- the prediction --------------------------------------------------------------------------

def predict_traffic(model: Stage, args, pp: int, dp: int, tp: int, stage: int,
                    first_step: bool) -> dict:
    """{(kind, dimension): [count, bytes, why]} of one training step on a rank of `stage`, from
    the shapes alone. A dimension of 1 carries nothing (it is not parallelised)."""
    m = args.micro_batches
    k = args.blocks // pp  # blocks per stage
    activation = args.batch_size // dp // m * args.seq * args.features * FLOAT_BYTES
    counted = {}
    if pp > 1:
        # GPipe: every micro-batch's activation forward, then its gradient back, one
        # neighbour each way (a middle stage has two).
        neighbours = (stage < pp - 1) + (stage > 0)
        sent = [f"{m} activations to stage {stage + 1}"] * (stage < pp - 1) + [
            f"{m} gradients to stage {stage - 1}"] * (stage > 0)
        received = [f"{m} gradients from stage {stage + 1}"] * (stage < pp - 1) + [
            f"{m} activations from stage {stage - 1}"] * (stage > 0)
        for kind, why in (("send", sent), ("recv", received)):
            counted[(kind, "pp")] = [m * neighbours, m * neighbours * activation, ", ".join(why)]
            if first_step:  # the warm-up vote (static or dynamic shapes): forward, then back
                counted[(kind, "pp")][0] += neighbours
                counted[(kind, "pp")][1] += neighbours * VOTE_BYTES
                counted[(kind, "pp")][2] += "; the schedule's vote (an int32)"
    if tp > 1:
        # per block and micro-batch: out's and down's outputs forward (partial sums), the
        # gradients of qkv's and up's inputs backward (each rank's from its own columns)
        count = 4 * k * m
        counted[("all_reduce", "tp")] = [count, count * activation,
                                         "4 per block and micro-batch: out, down forward; the "
                                         "inputs of qkv, up backward"]
    if dp > 1:
        units = [sum(padded(s, dp) for s in local_shapes(b, tp)) for b in model.blocks]
        root = [sum(padded(p.shape, dp) for p in model.norm.parameters())] if model.norm else []
        # Forward: a block unit is gathered for each micro-batch and resharded after it; the
        # root (the final norm) is gathered once and kept (FSDP does not reshard the root after
        # forward). Backward: gathered for the first micro-batch's backward and kept (pipelining
        # turns reshard-after-backward off), then one reduce_scatter of each unit's gradients,
        # summed over the micro-batches, when the last backward is done.
        gathers = m * len(units) + len(units) + len(root)
        counted[("all_gather", "dp")] = [gathers, ((m + 1) * sum(units) + sum(root))
                                         * FLOAT_BYTES,
                                         f"each block {m} forward (one per micro-batch) + 1 "
                                         "backward" + ("; the root once" if root else "")]
        counted[("reduce_scatter", "dp")] = [len(units) + len(root),
                                             (sum(units) + sum(root)) * FLOAT_BYTES,
                                             f"one per unit: gradients summed over the {m}"]
    return counted


def sent_per_rank(kind: str, size: int, group: int) -> int:
    """Bytes one rank sends for a collective of `size` bytes in a group of `group` ranks, by
    the ring algorithms of lesson 4 (send: all of it; recv: nothing)."""
    share = {"all_reduce": 2 * (group - 1), "all_gather": group - 1,
             "reduce_scatter": group - 1, "send": group, "recv": 0}[kind]
    return size * share // group


def predict_held(model: Stage, dp: int, tp: int, dp_rank: int, optimizer: str) -> dict:
    """Bytes of params, grads and optimizer state on one rank of a stage (ddpcourse.sharding's
    FSDP arithmetic on this rank's tensor-parallel pieces), plus Adam's step counters."""
    shapes = [s for b in model.blocks for s in local_shapes(b, tp)]
    if model.norm is not None:
        shapes += [tuple(p.shape) for p in model.norm.parameters()]
    held = predict_memory(shapes, dp, "fsdp", optimizer)[dp_rank]
    if optimizer == "adam":  # Adam's "step": a float32 scalar per parameter tensor
        held["optimizer"] += FLOAT_BYTES * len(shapes)
    return {part: held[part] for part in ("params", "grads", "optimizer")}


# --- training --------------------------------------------------------------------------------

def train(schedule, optimizer, batches, groups: dict, first: bool, last: bool):
    """Optimizer steps through the pipeline; this rank's losses (last stage) and the collectives of
    each step."""
    losses, steps = [], []
    for x, target in batches:
        micro = []
        with Collectives(groups) as seen:
            optimizer.zero_grad(set_to_none=True)
            schedule.step(*[x] if first else [], target=target if last else None,
                          losses=micro if last else None)
            optimizer.step()
        losses.append(torch.stack(micro).mean().item() if last else float("nan"))
        steps.append(seen.calls)
    return losses, steps


def optimizer_for(parameters, name: str, lr: float):
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr)
    return torch.optim.SGD(parameters, lr=lr, momentum=0.9 if name == "sgd_momentum" else 0)


def reference_train(model, batches, name: str, lr: float):
    optimizer = optimizer_for(model.parameters(), name, lr)
    losses = []
    for x, target in batches:
        loss = F.mse_loss(model(x), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    pp, dp, tp = factor(world_size, args)  # before any group exists: a refusal is one line
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=args.timeout)
    dist.init_process_group(backend, timeout=timeout)
    mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=DIMENSIONS,
                            backend_override=mesh_groups(DIMENSIONS, backend, timeout))
    stage, dp_rank, tp_rank = mesh.get_coordinate()
    first, last = stage == 0, stage == pp - 1

    # The same global batches on every rank (a seeded generator), and the same first weights.
    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.batch_size, args.seq, args.features)
    batches = [(torch.randn(shape, generator=generator).to(device),
                torch.randn(shape, generator=generator).to(device)) for _ in range(args.steps)]
    torch.manual_seed(args.seed)
    model = Stage([Block(args.features, args.heads, args.hidden) for _ in range(args.blocks)],
                  nn.LayerNorm(args.features)).to(device)

    # The reference: the whole model, one process, the whole batch (every rank trains it).
    reference = copy.deepcopy(model)
    reference_losses = reference_train(reference, batches, args.optimizer, args.lr)
    expected = dict(reference.named_parameters())

    # This rank's stage: blocks [start, start + k) of the same first weights, and their names
    # in the whole model.
    k = args.blocks // pp
    mine = copy.deepcopy(Stage.cut(model, stage, pp))
    names = [f"blocks.{stage * k + int(n.split('.')[1])}.{n.split('.', 2)[2]}"
             if n.startswith("blocks.") else n for n, _ in mine.named_parameters()]
    for block in mine.blocks:
        if tp > 1:  # tensor parallelism first: it turns the split weights into DTensors on tp
            parallelize_module(block, mesh["tp"], TP_PLAN)
        if dp > 1:
            fully_shard(block, mesh=mesh["dp"])
    if dp > 1:
        fully_shard(mine, mesh=mesh["dp"])  # the root unit: the final norm, on the last stage
    optimizer = optimizer_for(mine.parameters(), args.optimizer, args.lr)

    # The pipeline: this stage on the "pp" group; input and output shapes given (static), so
    # pipelining need not run a forward and a backward to find them.
    share = args.batch_size // dp
    # A stage's input needs a gradient (sent back to the stage before) except on the first.
    micro = (share // args.micro_batches, args.seq, args.features)
    pipe = PipelineStage(mine, stage, pp, device,
                         input_args=torch.empty(micro, device=device, requires_grad=not first),
                         output_args=torch.empty(micro, device=device, requires_grad=True),
                         group=mesh.get_group("pp"))
    schedule = ScheduleGPipe(pipe, n_microbatches=args.micro_batches, loss_fn=F.mse_loss)
    data = [(x[dp_rank * share:(dp_rank + 1) * share], y[dp_rank * share:(dp_rank + 1) * share])
            for x, y in batches]  # this dp row's samples (its tp ranks and stages share them)

    groups = {name: mesh.get_group(name) for name in DIMENSIONS}
    tick = time.perf_counter()
    losses, steps = train(schedule, optimizer, data, groups, first, last)
    step_s = (time.perf_counter() - tick) / args.steps
    held = held_bytes(mine, optimizer)
    difference, where = max(((p - expected[name]).abs().max().item(), name)
                            for name, p in zip(names, whole(mine), strict=True))
    report = {"coordinates": (stage, dp_rank, tp_rank), "losses": losses,
              "counted": [by_dimension(calls) for calls in steps], "difference": difference,
              "where": where, "held": held, "step_s": step_s,
              "predicted held": predict_held(Stage.cut(model, stage, pp), dp, tp, dp_rank,
                                             args.optimizer)}
    every = [None] * world_size if rank == 0 else None
    dist.gather_object(report, every, dst=0)

    worst, agree, memory_ok = 0.0, True, True
    if rank == 0:
        print(f"{world_size} ranks on {device.type} with {backend}: a {pp} x {dp} x {tp} mesh "
              f"(pp, dp, tp); {args.blocks} blocks ({args.features} features, {args.heads} "
              f"heads, MLP {args.hidden}), {k} per stage; global batch {args.batch_size} x "
              f"{args.seq} tokens, {args.micro_batches} micro-batches of "
              f"{share // args.micro_batches} per dp row; {args.steps} steps of "
              f"{args.optimizer}, lr {args.lr:g}")
        worst = max(r["difference"] for r in every)
        # the global batch's loss: the last stage's ranks, one per dp row (tp ranks repeat it)
        rows_losses = [r["losses"] for r in every if r["coordinates"][0] == pp - 1
                       and r["coordinates"][2] == 0]
        losses = [sum(col) / len(col) for col in zip(*rows_losses, strict=True)]
        print(f"pipeline x fsdp x tp: losses {' '.join(f'{x:.6f}' for x in losses)}")
        print(f"one process:          losses {' '.join(f'{x:.6f}' for x in reference_losses)}")
        at = max(range(world_size), key=lambda r: every[r]["difference"])
        print(f"largest parameter difference from one process: {worst:.1e} (rank {at}, "
              f"{every[at]['where']})")

        rows = []
        sizes = {"pp": pp, "dp": dp, "tp": tp}
        for s in range(pp):
            ranks = [r for r in range(world_size) if every[r]["coordinates"][0] == s]
            stage_model = Stage.cut(model, s, pp)
            for step in range(args.steps):
                predicted = predict_traffic(stage_model, args, pp, dp, tp, s, step == 0)
                seen = every[ranks[0]]["counted"][step]
                alike = all(every[r]["counted"][step] == seen for r in ranks)
                for key in sorted(set(predicted) | set(seen), key=lambda x: (x[1], x[0])):
                    want = predicted.get(key, [0, 0, "not predicted"])
                    got = seen.get(key, [0, 0])
                    same = want[:2] == got and alike
                    agree &= same
                    if step in (0, args.steps - 1) and (step == args.steps - 1 or not same
                                                         or key[0] in ("send", "recv")):
                        rows.append({"stage": s, "step": step + 1, "dimension": key[1],
                                     "collective": key[0], "predicted": want[0],
                                     "measured": got[0], "predicted bytes": want[1],
                                     "measured bytes": got[1],
                                     "sent per rank": sent_per_rank(key[0], got[1],
                                                                    sizes[key[1]]),
                                     "check": "same" if same else "DIFFERENT",
                                     "why": want[2]})
        print(f"\ncollectives of a training step, per rank (bytes: the whole tensor; every rank "
              f"of a stage alike; steps 2-{args.steps} alike, step 1 adds the vote)")
        print(format_table(rows))
        # What the whole job sends per dimension in a step after the first, all ranks added.
        traffic = {d: 0 for d in DIMENSIONS}
        for seen in every:
            for (kind, dimension), (_, size) in seen["counted"][-1].items():
                traffic[dimension] += sent_per_rank(kind, size, sizes[dimension])
        print("bytes sent per step by all ranks (ring model for collectives): "
              + ", ".join(f"{d} {traffic[d]}" for d in DIMENSIONS))

        memory = []
        for r, seen in enumerate(every):
            want = seen["predicted held"]
            got = {part: seen["held"][part] for part in want}
            same = want == got
            memory_ok &= same
            memory.append({"rank": r, "coordinates": ",".join(map(str, seen["coordinates"])),
                           **{f"{part} B": got[part] for part in want},
                           "total B": sum(got.values()), "predicted B": sum(want.values()),
                           "check": "same" if same else "DIFFERENT"})
        steps = ", + 4 B of step counter per parameter" if args.optimizer == "adam" else ""
        print(f"\nparameters, gradients and {args.optimizer}'s state held by each rank after the "
              f"last step, predicted: lesson 8's FSDP arithmetic on the rank's tp pieces{steps}")
        print(format_table(memory))
        numbers = sum(p.numel() for p in model.parameters())
        state = numbers * FLOAT_BYTES * OPTIMIZER_BUFFERS[args.optimizer]
        print(f"(the whole model in one process: {2 * numbers * FLOAT_BYTES + state} B of "
              f"parameters, gradients and {args.optimizer}'s buffers)")
        step_s = max(r["step_s"] for r in every)
        same = worst <= args.tolerance
        print(f"check: {'equal' if same else 'NOT equal'} to one process (largest difference "
              f"{worst:.1e}, tolerance {args.tolerance:g}); collectives "
              f"{'as predicted' if agree else 'NOT as predicted'}; memory "
              f"{'as predicted' if memory_ok else 'NOT as predicted'}")
        print(summary_line(world_size=world_size, mesh=f"{pp}x{dp}x{tp}", max_diff=worst,
                           same_as_one_process=same, collectives_as_predicted=agree,
                           memory_as_predicted=memory_ok,
                           **{f"{d}_sent_per_step": traffic[d] for d in DIMENSIONS},
                           step_s=round(step_s, 3), backend=backend,
                           wall_s=round(time.perf_counter() - started, 2)))
    end_with_rank_0s_verdict(
        rank == 0 and (worst > args.tolerance or not agree or not memory_ok), device)


if __name__ == "__main__":
    main()
