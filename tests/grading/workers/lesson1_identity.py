"""Run under torchrun by the lesson 1 grading tests: checks the graded code in a real job.

Each process compares identity_from_env() with what torch.distributed says, checks
global_rank() against its own rank, builds one group per node from node_groups(), and
all-reduces inside its node's group. Rank 0 prints one line when every rank agrees.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse.grading import load_exercises

ex = load_exercises(1)
problems = []
me = ex.identity_from_env(os.environ)
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
truth = {"rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]), "world_size": world,
         "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
         "node_rank": int(os.environ["GROUP_RANK"])}
if me != truth:
    problems.append(f"identity_from_env gave {me}, the job says {truth}")
if ex.global_rank(truth["node_rank"], truth["local_rank"], truth["local_world_size"]) != rank:
    problems.append("global_rank() disagrees with dist.get_rank()")

nodes = world // truth["local_world_size"]
groups = ex.node_groups(nodes, truth["local_world_size"])
# Every process must take part in creating every group, in the same order.
handles = [dist.new_group(ranks) for ranks in groups]
mine = [i for i, ranks in enumerate(groups) if rank in ranks]
if len(mine) != 1:
    problems.append(f"rank {rank} is in {len(mine)} node groups, expected exactly 1")
else:
    total = torch.tensor([float(rank)])
    dist.all_reduce(total, group=handles[mine[0]])
    same_node = [r for r in range(world)
                 if r // truth["local_world_size"] == truth["node_rank"]]
    if total.item() != float(sum(same_node)):
        problems.append(f"all_reduce in rank {rank}'s node group gave {total.item():g}, "
                        f"expected the sum of ranks {same_node}")

everyone = [None] * world
dist.all_gather_object(everyone, problems)
dist.destroy_process_group()
if rank == 0:
    failures = [p for per_rank in everyone for p in per_rank]
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print(f"identity and node groups agree on all {world} ranks")
