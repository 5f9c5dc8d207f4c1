"""Lesson 4: process groups. The world group, one group per node, even and odd ranks.

    make lesson4 NNODES=2 NPROC=2     # lesson4_collectives.py, then this, on 2 simulated nodes
    torchrun --nnodes=2 --node-rank=0 --nproc-per-node=2 --master-addr=127.0.0.1 \
        --master-port=29500 scripts/lesson4_groups.py     # and the same with --node-rank=1

A group is a subset of the ranks that can run collectives among themselves. Every process
must call new_group for every group, in the same order, even for groups it is not in:
creating a group is itself a collective step of the whole world.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import pick_device, world_of_one_unless_launched


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective may wait before the job fails")
    args = parser.parse_args()
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    started = time.perf_counter()

    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])  # processes on this node
    node_rank = int(os.environ["GROUP_RANK"])               # torchrun's name for the node rank

    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=args.timeout)
    # device_id binds the group to this GPU, so nccl's barrier knows which one to use.
    dist.init_process_group(backend, timeout=timeout,
                            device_id=device if device.type == "cuda" else None)
    world = dist.get_world_size()

    # The world group: every process. Collectives use it when no group= is given.
    world_group = dist.group.WORLD
    if rank == 0:
        print(f"world group: ranks {dist.get_process_group_ranks(world_group)}, "
              f"size {dist.get_world_size(world_group)}, backend {dist.get_backend(world_group)}")

    # One group per node. torchrun starts the same number of processes on every node, so
    # node n holds global ranks n*L .. n*L+L-1 (L = LOCAL_WORLD_SIZE).
    nodes = world // local_world_size
    node_ranks = [list(range(n * local_world_size, (n + 1) * local_world_size))
                  for n in range(nodes)]
    node_groups = [dist.new_group(ranks, timeout=timeout) for ranks in node_ranks]  # all, in order
    my_node = node_groups[node_rank]

    # Even and odd ranks (with one process there are no odd ranks: that group is skipped by
    # every process alike, so the order of new_group calls still agrees).
    evens, odds = list(range(0, world, 2)), list(range(1, world, 2))
    even_group = dist.new_group(evens, timeout=timeout)
    odd_group = dist.new_group(odds, timeout=timeout) if odds else None
    my_parity = even_group if rank % 2 == 0 else odd_group

    # A collective on a subgroup involves only its members: a per-node sum of global ranks.
    node_sum = torch.tensor([float(rank)], device=device)
    dist.all_reduce(node_sum, group=my_node)

    # The same on the even / odd groups.
    parity_sum = torch.tensor([float(rank)], device=device)
    dist.all_reduce(parity_sum, group=my_parity)

    # broadcast's src is a GLOBAL rank even inside a group: the node's first process is
    # group rank 0, which get_global_rank turns into its global rank. It sends its pid.
    leader = dist.get_global_rank(my_node, 0)
    leader_pid = torch.tensor([os.getpid()], dtype=torch.int64, device=device)
    dist.broadcast(leader_pid, src=leader, group=my_node)

    # get_rank(group) is the rank inside the group (-1 for a process outside it);
    # get_group_rank(group, global_rank) and get_global_rank(group, group_rank) translate.
    report = {
        "rank": rank,
        "node": node_rank,
        "local rank": local_rank,
        "pid": os.getpid(),
        "rank in node group": dist.get_rank(my_node),
        "get_group_rank": dist.get_group_rank(my_node, rank),
        "node leader": leader,
        "leader's pid": int(leader_pid.item()),
        "node sum": int(node_sum.item()),
    }
    parity = {
        "rank": rank,
        "rank in even group": dist.get_rank(even_group),
        "rank in odd group": dist.get_rank(odd_group) if odd_group is not None else -1,
        "parity sum": int(parity_sum.item()),
    }
    reports = [None] * world if rank == 0 else None
    dist.gather_object((report, parity), reports, dst=0)

    if rank == 0:
        print(f"node groups (from LOCAL_WORLD_SIZE={local_world_size} and GROUP_RANK): "
              + ", ".join(f"node {n} = ranks {r}" for n, r in enumerate(node_ranks))
              + f"; each of size {dist.get_world_size(my_node)}, backend "
              f"{dist.get_backend(my_node)}")
        print(format_table([r for r, _ in reports]))
        print(f"\nparity groups: even ranks {evens}, odd ranks {odds}")
        print(format_table([p for _, p in reports]))
        problems = []
        for r, p in reports:
            same_node = node_ranks[r["node"]]
            mates = evens if r["rank"] % 2 == 0 else odds
            if r["node sum"] != sum(same_node):
                problems.append(f"rank {r['rank']}: node sum {r['node sum']} != {sum(same_node)}")
            if not r["rank in node group"] == r["get_group_rank"] == same_node.index(r["rank"]):
                problems.append(f"rank {r['rank']}: wrong rank in its node group")
            leader_pid = reports[same_node[0]][0]["pid"]
            if r["node leader"] != same_node[0] or r["leader's pid"] != leader_pid:
                problems.append(f"rank {r['rank']}: did not hear from its node's first process")
            if p["parity sum"] != sum(mates):
                problems.append(f"rank {r['rank']}: parity sum {p['parity sum']} != {sum(mates)}")
        print("\ncheck: " + ("every per-node and per-parity result is right" if not problems
                             else "PROBLEMS: " + "; ".join(problems)))
        print(summary_line(world_size=world, nodes=nodes, node_groups=len(node_groups),
                           backend=dist.get_backend(), ok=not problems,
                           wall_s=round(time.perf_counter() - started, 2)))
        failed = bool(problems)
    else:
        failed = False
    dist.destroy_process_group()
    if failed:
        raise SystemExit("error: a group collective gave a wrong result")


if __name__ == "__main__":
    main()
