"""Lesson 8 experiment: tensor parallelism with DTensor: a linear layer split by columns, by
rows, and both, each compared with the dense layer, every collective counted and sized.

    make lesson8-tp NPROC=2                         # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/experiments/lesson8_tensor_parallel.py

A linear layer y = x W^T + b is a matrix product, and a matrix product splits two ways:
- by columns of the output (ColwiseParallel): rank r keeps rows r of W (its output features)
  and computes its own slice of y from the whole x. Joining the slices is an all-gather;
- by rows of the input (RowwiseParallel): rank r keeps the columns of W that meet its slice of
  x's features and computes a partial y; adding the partials is an all-reduce.
Put one after the other (a column-split layer, then a row-split one, as in a transformer's
MLP) and the first one's output slice is exactly the second one's input slice: the pair costs
one all-reduce in forward. parallelize_module applies the splits to a model on a DeviceMesh;
the weights become DTensors, each rank holding its piece. Every result is compared with the
same layers unsplit, and every collective is counted (CommDebugMode) and sized (torch's
flight recorder): the all-reduces carry activations, batch x features, not weights.
"""

import copy
import os
import time
from datetime import timedelta

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # the flight recorder sizes collectives

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import NUM_CLASSES, load_datasets
from ddpcourse.report import summary_line
from ddpcourse.runtime import (
    end_with_rank_0s_verdict,
    fail,
    pick_device,
    world_of_one_unless_launched,
)
from ddpcourse.sharding import collectives


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=480,
                        help="hidden features of the MLP (480 splits evenly over 1 to 6 ranks)")
    parser.add_argument("--steps", type=int, default=5, help="SGD steps of the MLP, split and not")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest difference from the unsplit layers that counts as equal")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.hidden < 1 or args.steps < 1 or args.batch_size < 1:
        parser.error("--hidden, --steps and --batch-size must be at least 1")
    return args


class MLP(nn.Module):
    """Images -> hidden features -> classes: a transformer's MLP block, in small."""

    def __init__(self, in_features: int, hidden: int, classes: int):
        super().__init__()
        self.up = nn.Linear(in_features, hidden)
        self.down = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.down(F.relu(self.up(x.flatten(1))))


def comms(mode: CommDebugMode) -> str:
    """'all_reduce x1' for what ran inside `mode`; 'none' when nothing did."""
    counts = {str(op).split(".")[-1].removesuffix("_into_tensor"): n
              for op, n in mode.get_comm_counts().items() if n}
    return ", ".join(f"{op} x{n}" for op, n in sorted(counts.items())) or "none"


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if args.hidden % world_size:
        fail(f"--hidden {args.hidden} does not split evenly over {world_size} ranks; use a "
             f"multiple of {world_size}")
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    # One dimension, all ranks: the group the split layers talk over.
    # A group of its own for the mesh, as in lesson8_fsdp.py: DTensor keeps meshes until exit.
    mesh = DeviceMesh.from_group(dist.new_group(timeout=timedelta(seconds=args.timeout)),
                                 device.type, mesh_dim_names=("tp",))

    train_set, _ = load_datasets("digits")
    in_features, classes = train_set[0][0].numel(), NUM_CLASSES["digits"]
    # Tensor parallelism splits the layers, not the data: every rank gets the SAME batch.
    order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(args.seed))
    batches = [train_set[order[i * args.batch_size:(i + 1) * args.batch_size]]
               for i in range(args.steps)]
    x = batches[0][0].flatten(1).to(device)
    torch.manual_seed(args.seed)  # the same weights on every rank, before any split
    dense = MLP(in_features, args.hidden, classes).to(device)
    expected_up = dense.up(x).detach()  # the dense layers' results, to compare with
    hidden = F.relu(expected_up)
    expected_down = dense.down(hidden).detach()
    share = args.hidden // world_size
    lines, worst = [], 0.0

    # A. By columns: this rank keeps `share` output features (rows of the weight).
    up = parallelize_module(copy.deepcopy(dense.up), mesh,
                            ColwiseParallel(use_local_output=False))  # keep the DTensor
    with CommDebugMode() as forward:
        y = up(x)                                   # x whole on every rank; y: Shard(-1)
    with CommDebugMode() as join:
        whole = y.full_tensor()                     # the slices joined: an all-gather
    mine = y.to_local()
    first = rank * share
    diff_a = max((mine - expected_up[:, first:first + share]).abs().max().item(),
                 (whole - expected_up).abs().max().item())
    worst = max(worst, diff_a)
    lines.append(f"A. column split, Linear({in_features}, {args.hidden}): weight piece "
                 f"{list(up.weight.to_local().shape)} per rank, output {y.placements}; "
                 f"forward: {comms(forward)}; joining the slices: {comms(join)}; "
                 f"largest difference from the dense layer {diff_a:.1e}")

    # B. By rows: this rank keeps the weight's columns that meet its slice of the input.
    down = parallelize_module(copy.deepcopy(dense.down), mesh,
                              RowwiseParallel(input_layouts=Shard(-1)))
    hidden_slices = distribute_tensor(hidden, mesh, [Shard(-1)])  # rank r: features of r
    seen = len(collectives())
    with CommDebugMode() as forward:
        z = down(hidden_slices)                     # partial sums, added by an all-reduce
    reduced = sum(c["elements"] for c in collectives()[seen:] if c["op"] == "all_reduce")
    diff_b = (z - expected_down).abs().max().item()
    worst = max(worst, diff_b)
    lines.append(f"B. row split, Linear({args.hidden}, {classes}): weight piece "
                 f"{list(down.weight.to_local().shape)} per rank, input {hidden.shape[-1]} "
                 f"features as {share} per rank; forward: {comms(forward)} of {reduced} "
                 f"values (the output, {len(x)} x {classes}); largest difference from the "
                 f"dense layer {diff_b:.1e}")

    # C. Both, as in a transformer's MLP: columns, then rows. Trained beside the dense MLP.
    model = parallelize_module(copy.deepcopy(dense), mesh,
                               {"up": ColwiseParallel(), "down": RowwiseParallel()})
    reference = copy.deepcopy(dense)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    losses = {"split": [], "dense": []}
    for step, (images, labels) in enumerate(batches):
        images, labels = images.to(device), labels.to(device)
        for name, m, optimizer in (("split", model, optimizers[0]),
                                   ("dense", reference, optimizers[1])):
            with CommDebugMode() as forward:
                loss = F.cross_entropy(m(images), labels)
            with CommDebugMode() as backward:
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            optimizer.step()
            losses[name].append(loss.item())
            if name == "split" and step == 0:
                counted = f"forward: {comms(forward)}; backward: {comms(backward)}"
    weight_diff = max((p.full_tensor() - q).abs().max().item()
                      for p, q in zip(model.parameters(), reference.parameters(), strict=True))
    loss_diff = max(abs(a - b) for a, b in zip(losses["split"], losses["dense"], strict=True))
    worst = max(worst, weight_diff, loss_diff)
    # In the middle of a model the MLP's input needs its gradient too: each rank has only a
    # part of it (from its own columns), so backward adds them with one more all-reduce.
    probe = model(x.clone().requires_grad_()).sum()
    seen = len(collectives())
    with CommDebugMode() as backward:
        probe.backward()
    reduced = sum(c["elements"] for c in collectives()[seen:] if c["op"] == "all_reduce")
    lines.append(f"C. column then row split (the MLP): {counted}; after {args.steps} SGD "
                 f"steps, largest loss difference {loss_diff:.1e}, largest weight difference "
                 f"{weight_diff:.1e}; with an input that needs its gradient, backward: "
                 f"{comms(backward)} of {reduced} values (that gradient, {len(x)} x {in_features})")

    pieces = [None] * world_size if rank == 0 else None
    dist.gather_object((list(model.up.weight.to_local().shape),
                        list(model.down.weight.to_local().shape)), pieces, dst=0)
    if rank == 0:
        print(f"{world_size} rank(s) on {device.type} with {backend}, one mesh dimension "
              f"('tp'); the same batch of {args.batch_size} images on every rank")
        for line in lines:
            print(line)
        for r, (up_piece, down_piece) in enumerate(pieces):
            print(f"rank {r}: up.weight piece {up_piece}, down.weight piece {down_piece}")
        for step in range(args.steps):
            print(f"step {step + 1}/{args.steps}  loss split {losses['split'][step]:.6f}  "
                  f"dense {losses['dense'][step]:.6f}")
        same = worst <= args.tolerance
        print(f"check: the split layers {'equal' if same else 'DO NOT equal'} the dense ones "
              f"(largest difference {worst:.1e}, tolerance {args.tolerance:g})")
        print(summary_line(world_size=world_size, hidden=args.hidden, same_as_dense=same,
                           max_diff=worst, backend=backend,
                           wall_s=round(time.perf_counter() - started, 2)))
    end_with_rank_0s_verdict(rank == 0 and worst > args.tolerance, device)


if __name__ == "__main__":
    main()
