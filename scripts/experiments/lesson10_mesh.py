"""Lesson 10 experiment: a device mesh: W ranks laid out as a grid, one process group per row
and per column, each group checked against the arithmetic and shown at work.

    make lesson10-mesh NPROC=4                          # prints, then runs, this command:
    torchrun --nproc-per-node=4 scripts/experiments/lesson10_mesh.py

Every kind of parallelism needs its own groups of ranks: data parallelism averages gradients
over some ranks, tensor parallelism adds partial sums over others. A device mesh is the
bookkeeping: W = dp x tp ranks written row by row into a dp x tp grid,

    rank = dp_coordinate x tp + tp_coordinate          (row-major: the last dimension is
                                                         the one that changes fastest)

so W = 4 is [[0, 1], [2, 3]]. A rank's "tp" group is its row (the ranks that share its dp
coordinate: {0, 1} and {2, 3}); its "dp" group is its column ({0, 2} and {1, 3}).
init_device_mesh creates all of them at once, one new process group per row and per column,
and mesh.get_group("dp") hands a rank the one it belongs to. Here every rank reports its
coordinates and the global ranks of each of its groups; rank 0 checks them against the
formula above, computed by hand. Then each group runs one all_reduce of 2^rank: the sum, read
in binary, names exactly the ranks that took part (5 = 2^0 + 2^2: ranks 0 and 2). At W = 8
the same is shown for a 3-D mesh (pp, dp, tp) = (2, 2, 2). Tensor parallelism goes on the
last dimension on purpose: its ranks are consecutive, on one node, where links are fastest.
"""

import math
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.distributed_c10d import C10DBackend

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import (
    end_with_rank_0s_verdict,
    fail,
    pick_device,
    world_of_one_unless_launched,
)


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=None,
                        help="size of the last mesh dimension (the mesh is W / tp x tp; "
                             "default: W's smallest factor that leaves dp >= 2, 2 where W is even)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.tp is not None and args.tp < 2:
        parser.error("--tp must be at least 2")
    return args


def grid(world_size: int, tp: int | None) -> tuple[int, int]:
    """(dp, tp) for W ranks, or a one-line refusal: both dimensions must have 2 ranks or more
    (a dimension of 1 is no parallelism at all). tp None: the smallest that does."""
    if tp is None:
        tp = next((f for f in range(2, world_size) if world_size % f == 0
                   and world_size // f >= 2), None)
        if tp is None:
            fail(f"{world_size} rank(s) make no 2-D mesh with 2 ranks or more in each dimension "
                 "(W must be a product of two such numbers: e.g. 4, 6 or 9)")
    if world_size % tp or world_size // tp < 2:
        fail(f"{world_size} rank(s) do not make a 2-D mesh with a tp dimension of {tp}: W must "
             f"be {tp} x dp with dp >= 2 (e.g. {2 * tp} or {3 * tp})")
    return world_size // tp, tp


def mesh_groups(names, backend: str, timeout: timedelta) -> dict:
    """init_device_mesh's backend_override giving every dimension's groups a timeout: without
    it they get the backend's default (30 minutes for gloo), not init_process_group's. The
    timeout travels in an options object (device_mesh.py reads its _timeout), one per
    dimension (the kinds init_device_mesh's signature names): nccl insists on its own
    (_create_nccl_process_group), gloo reads the timeout alone."""
    groups = {}
    for name in names:
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options.is_high_priority_stream = False  # nccl's default when given no options
        else:
            options = C10DBackend.Options(backend, timeout=timeout)
        options._timeout = timeout
        groups[name] = (backend, options)
    return groups


def by_hand(rank: int, shape: tuple[int, ...]) -> tuple[list[int], list[list[int]]]:
    """The arithmetic of a row-major mesh: (the coordinates of `rank`, and for each dimension
    the global ranks of its group: those that differ from it in that coordinate only)."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    coordinates = [rank // stride % size for stride, size in zip(strides, shape, strict=True)]
    groups = [[rank + (c - coordinates[d]) * strides[d] for c in range(shape[d])]
              for d in range(len(shape))]
    return coordinates, groups


def ranks_in(total: int) -> list[int]:
    """The ranks whose 2^rank make up `total`: the bits that are set."""
    return [r for r in range(total.bit_length()) if total >> r & 1]


def show(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


def explore(device, backend, shape, names, timeout):
    """Build the mesh, and return this rank's view of it: coordinates, each dimension's group
    and the result of one all_reduce of 2^rank in each."""
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names,
                            backend_override=mesh_groups(names, backend, timeout))
    rank = dist.get_rank()
    seen = {"coordinates": mesh.get_coordinate(), "groups": [], "sums": []}
    for name in names:
        group = mesh.get_group(name)  # this rank's group along `name`
        seen["groups"].append(dist.get_process_group_ranks(group))
        # 2^rank fits an int64 up to rank 62: each bit of the sum is one rank that took part.
        value = torch.tensor([1 << rank], dtype=torch.int64, device=device)
        dist.all_reduce(value, group=group)
        seen["sums"].append(int(value.item()))
    return seen


def rows_of(seen_by_rank, shape, names):
    """The table of one mesh and whether everything matched the arithmetic."""
    rows, matched = [], True
    for rank, seen in enumerate(seen_by_rank):
        coordinates, groups = by_hand(rank, shape)
        same = (list(seen["coordinates"]) == coordinates and seen["groups"] == groups
                and [ranks_in(s) for s in seen["sums"]] == groups)
        matched &= same
        row = {"rank": rank, "coordinates": show(seen["coordinates"])}
        for name, group, total in zip(names, seen["groups"], seen["sums"], strict=True):
            row[f"{name} group"] = show(group)
            row[f"all_reduce {name}"] = f"{total} = ranks {show(ranks_in(total))}"
        row["by hand"] = show(coordinates) + "; " + "; ".join(show(g) for g in groups)
        row["check"] = "same" if same else "DIFFERENT"
        rows.append(row)
    return rows, matched


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dp, tp = grid(world_size, args.tp)  # before any group exists: a refusal is one line
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=args.timeout)
    dist.init_process_group(backend, timeout=timeout)

    meshes = [((dp, tp), ("dp", "tp"))]
    if dp % 2 == 0 and dp >= 4:  # W = 8: (pp, dp, tp) = (2, 2, 2); every dimension >= 2
        meshes.append(((2, dp // 2, tp), ("pp", "dp", "tp")))
    results = []
    for shape, names in meshes:
        seen = explore(device, backend, shape, names, timeout)
        every = [None] * world_size if rank == 0 else None
        dist.gather_object(seen, every, dst=0)
        results.append((shape, names, every))

    matched = True
    if rank == 0:
        print(f"{world_size} ranks on {device.type} with {backend}; rank = "
              "sum of coordinate x stride, row-major (the last dimension changes fastest)")
        for shape, names, every in results:
            layout = torch.arange(world_size).reshape(shape).tolist()
            print(f"\nmesh {' x '.join(map(str, shape))} ({', '.join(names)}): {layout}")
            rows, same = rows_of(every, shape, names)
            matched &= same
            print(format_table(rows))
        print(f"\ncheck: every group and every all_reduce "
              f"{'matches' if matched else 'DOES NOT match'} the arithmetic")
        print(summary_line(world_size=world_size,
                           meshes="+".join("x".join(map(str, s)) for s, _, _ in results),
                           groups_match=matched, backend=backend,
                           wall_s=round(time.perf_counter() - started, 2)))
    end_with_rank_0s_verdict(rank == 0 and not matched, device)


if __name__ == "__main__":
    main()
