"""Run by the lesson 4 grading tests as the ranks of a relayed job: one lesson 4 check per
job, each rank in a sandbox of its own whose only road to the others is the relay
(ddpcourse/course/relay.py); tests/grading/test_lesson4.py judges it.

What a rank reports is only what the submission returned (the tensors, whether a ValueError
came). How it was computed (every message with its peer, size and a digest of its content;
every collective) is what the relay saw, and for the exercises built from messages the relay
refuses every ready-made collective. Each rank's inputs come from a secret the relay gave that
rank alone, so a rank cannot compute another's numbers: they must travel. The rank notes each
case's start to the relay, which files what follows under it.

    python ddpcourse/course/workers/lesson4_checks.py --check ring_allreduce   (as a relayed rank)
"""

from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse.course.probes import lesson4_data
from ddpcourse.course.workers import common
from ddpcourse.course.workers.common import RANK, WORLD, case, relayed_rank

GROUP_TIMEOUT = timedelta(seconds=10)   # a check's process group: a stuck call fails after this
HANG_TIMEOUT = timedelta(seconds=4)     # the fix_hang check: a wrong fix must fail fast


def data(seed, shape, dtype):
    return lesson4_data(common.SECRET, seed, shape, dtype)


def raised_value_error(call) -> bool:
    try:
        call()
    except ValueError:
        return True
    return False


# --- l4_ring_allreduce ----------------------------------------------------------------------

def ring_cases(world):
    return [((1,), torch.float32), ((7,), torch.float32), ((1000,), torch.float32),
            ((3, 5), torch.float32), ((world + 1,), torch.int64), ((2, 3, 2), torch.int64),
            ((6 * world + 1, 4), torch.float64)]


def observe_ring_allreduce(ex):
    """Per case: the graded function's result (in place?), computed while collectives are
    refused, and its messages. The judge sums every rank's data itself."""
    cases = []
    for i, (shape, dtype) in enumerate(ring_cases(WORLD)):
        got = data(i, shape, dtype)
        pointer = got.data_ptr()
        record = case()
        ex.ring_all_reduce(got)
        cases.append(dict(record, got=got, pointers=[pointer, got.data_ptr()]))
    return cases


# --- l4_all_gather --------------------------------------------------------------------------

GATHER_CASES = [((3,), torch.float32), ((2, 2), torch.float32), ((1,), torch.float32),
                ((5,), torch.int64)]


def observe_all_gather(ex):
    cases = []
    for i, (shape, dtype) in enumerate(GATHER_CASES):
        mine = data(10 + i, shape, dtype)
        got = [torch.zeros_like(mine) for _ in range(WORLD)]
        record = case()
        ex.all_gather_p2p(got, mine.clone())
        cases.append(dict(record, got=got))
    record = case()
    too_many = raised_value_error(lambda: ex.all_gather_p2p(
        [torch.zeros(3) for _ in range(WORLD + 1)], torch.zeros(3)))
    return {"cases": cases, "too_many_refused": too_many, "too_many": record}


# --- l4_broadcast_tree ----------------------------------------------------------------------

def broadcast_roots(world):
    return sorted({0, world - 1, world // 2})


BROADCAST_SHAPES = [((5,), torch.float32), ((2, 3), torch.int64)]


def observe_broadcast_tree(ex):
    results = []
    for i, src in enumerate(broadcast_roots(WORLD)):
        for shape, dtype in BROADCAST_SHAPES:
            got = data(20 + i, shape, dtype)
            record = case()
            ex.tree_broadcast(got, src)
            results.append(dict(record, got=got))
    record = case()
    bad_root = raised_value_error(lambda: ex.tree_broadcast(torch.zeros(2), WORLD))
    return {"results": results, "bad_root_refused": bad_root, "bad_root": record}


def observe_broadcast_tree_shape(ex):
    """From roots W-1 and 0: the result and the messages of each rank."""
    runs = []
    for src in sorted({WORLD - 1, 0}):
        got = data(30 + src, (4,), torch.float32)
        record = case()
        ex.tree_broadcast(got, src)
        runs.append(dict(record, src=src, got=got))
    return runs


# --- l4_node_groups -------------------------------------------------------------------------

def observe_node_groups(ex):
    # Ranks that create different groups, or in another order, are refused by the relay at
    # once (one name, two lists of ranks): the check fails with its reason, nothing hangs.
    group = ex.node_group(timeout=GROUP_TIMEOUT)
    ranks = dist.get_process_group_ranks(group)
    total = torch.tensor([float(RANK)])
    dist.all_reduce(total, group=group)
    leader = []
    for dtype in (torch.float32, torch.int64):
        mine = torch.tensor([100 + RANK, 7], dtype=dtype)
        ex.node_leader_broadcast(mine, group)
        leader.append(mine)
    last_two = None
    if WORLD >= 3:
        # A group whose rank 0 is not global rank 0, even on one node: the leader is the
        # group's first process, global rank W-2 (broadcast's src is a global rank).
        pair = dist.new_group([WORLD - 2, WORLD - 1], timeout=GROUP_TIMEOUT)
        if RANK >= WORLD - 2:
            last_two = torch.tensor([100 + RANK, 7])
            ex.node_leader_broadcast(last_two, pair)
    return {"ranks": ranks, "total": total.item(), "leader": leader,
            "last_two": last_two}


# --- l4_fix_hang ----------------------------------------------------------------------------

def observe_fix_hang(ex):
    loss = torch.tensor(1.5 + RANK)
    result = ex.report_loss(loss, RANK)
    # Every rank must come out of report_loss in step with the others: one more collective.
    after = torch.ones(1)
    dist.all_reduce(after)
    return {"loss": loss,
            "result": None if result is None else float(result), "after": after.item()}


# check -> (what it observes, the timeout of its process group)
CHECKS = {
    "ring_allreduce": (observe_ring_allreduce, GROUP_TIMEOUT),
    "all_gather": (observe_all_gather, GROUP_TIMEOUT),
    "broadcast_tree": (observe_broadcast_tree, GROUP_TIMEOUT),
    "broadcast_tree_shape": (observe_broadcast_tree_shape, GROUP_TIMEOUT),
    "node_groups": (observe_node_groups, GROUP_TIMEOUT),
    "fix_hang": (observe_fix_hang, HANG_TIMEOUT),
}


if __name__ == "__main__":
    relayed_rank(4, CHECKS, "one lesson 4 grading check, as a relayed rank")
