"""Run under torchrun by the lesson 1 grading tests, in the submission's sandbox: runs the
graded code in a real job and reports what it saw; tests/grading/test_lesson1.py judges it.

identity: what identity_from_env(os.environ) returned on each process (the judge compares it
with the job's layout).
node_groups: what node_groups() returned on each process, and the sum that an all-reduce
inside that process's own node group gave (the judge expects the sum of its node's ranks).

Each check runs in a process group of its own (common.py); rank 0 writes every rank's
observations for the judge. --submissions A,B,... grades several submission folders.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse.course.workers.common import RANK, WORLD, observe_each_submission

GROUP_TIMEOUT = timedelta(seconds=30)
LOCAL_WORLD = int(os.environ["LOCAL_WORLD_SIZE"])


def observe_identity(ex):
    return ex.identity_from_env(dict(os.environ))


def observe_node_groups(ex):
    """The groups returned, and the sum of the ranks in this process's node group (None
    unless it is in exactly one)."""
    groups = ex.node_groups(WORLD // LOCAL_WORLD, LOCAL_WORLD)
    handles = [dist.new_group(ranks, timeout=GROUP_TIMEOUT) for ranks in groups]
    mine = [i for i, ranks in enumerate(groups) if RANK in ranks]
    total = None
    if len(mine) == 1:
        summed = torch.tensor([float(RANK)])
        dist.all_reduce(summed, group=handles[mine[0]])
        total = summed.item()
    return {"groups": groups, "total": total}


CHECKS = {"identity": observe_identity, "node_groups": observe_node_groups}


if __name__ == "__main__":
    observe_each_submission(1, CHECKS, GROUP_TIMEOUT, "lesson 1 grading checks")
