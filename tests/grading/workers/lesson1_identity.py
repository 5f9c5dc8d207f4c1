"""Run under torchrun by the lesson 1 grading tests: checks the graded code in a real job.

identity: each process compares identity_from_env(os.environ) with what the job says
(torch.distributed's rank and world size, torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE and
GROUP_RANK).
node_groups: every process builds one group per node from node_groups() and all-reduces
inside its own node's group; the sum must be that of the ranks on its node.

Each check runs in a process group of its own (common.py). Rank 0 prints one line per
check: `<name>: ok on W ranks` or `<name>: FAILED: ...`. --submissions A,B,... grades
several submission folders, one block after `### submission A` each.
"""

import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from common import (
    RANK,
    WORLD,
    everyones_verdict,
    exercises_or_error,
    grade_each_submission,
    group_of_its_own,
    one_line,
)

GROUP_TIMEOUT = timedelta(seconds=30)
LOCAL_WORLD = int(os.environ["LOCAL_WORLD_SIZE"])
NODE = int(os.environ["GROUP_RANK"])


def check_identity(ex):
    me = ex.identity_from_env(dict(os.environ))
    truth = {"rank": dist.get_rank(), "local_rank": int(os.environ["LOCAL_RANK"]),
             "world_size": dist.get_world_size(), "local_world_size": LOCAL_WORLD,
             "node_rank": NODE}
    if me != truth:
        return [f"identity_from_env gave {me}, the job says {truth}"]
    return []


def check_node_groups(ex):
    groups = ex.node_groups(WORLD // LOCAL_WORLD, LOCAL_WORLD)
    # Every process must take part in creating every group, in the same order.
    handles = [dist.new_group(ranks, timeout=GROUP_TIMEOUT) for ranks in groups]
    mine = [i for i, ranks in enumerate(groups) if RANK in ranks]
    if len(mine) != 1:
        return [f"rank {RANK} is in {len(mine)} node groups, expected exactly 1"]
    total = torch.tensor([float(RANK)])
    dist.all_reduce(total, group=handles[mine[0]])
    same_node = [r for r in range(WORLD) if r // LOCAL_WORLD == NODE]
    if total.item() != float(sum(same_node)):
        return [f"all_reduce in rank {RANK}'s node group gave {total.item():g}, expected the "
                f"sum of ranks {same_node} (the processes of node {NODE})"]
    return []


CHECKS = {"identity": check_identity, "node_groups": check_node_groups}


def run_checks(store, tag) -> list[str]:
    ex, import_error = exercises_or_error(1)
    lines = []
    for name, check in CHECKS.items():
        with group_of_its_own(store, f"lesson1/{tag}/{name}", GROUP_TIMEOUT):
            try:
                problems = [import_error] if import_error else check(ex)
            except BaseException as error:  # the graded code raised: the next check runs
                problems = [f"rank {RANK}: {one_line(error)}"]
            gathered = everyones_verdict(store, f"lesson1/{tag}/{name}", json.dumps(problems))
        problems = [p for v in gathered for p in (json.loads(v) if v.startswith("[") else [v])]
        lines.append(f"{name}: " + (f"FAILED: {'; '.join(problems[:4])}" if problems
                                    else f"ok on {WORLD} ranks"))
    return lines


if __name__ == "__main__":
    grade_each_submission(run_checks, "lesson 1 grading checks")
