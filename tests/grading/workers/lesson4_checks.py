"""Run under torchrun by the lesson 4 grading tests, in the submission's sandbox: every
lesson 4 exercise run in one job, and what it did reported; tests/grading/test_lesson4.py
judges it.

Each exercise built from messages is observed twice over: its result (while every ready-made
collective raises), and its mechanism (the messages it sent, with peers and sizes; see
traffic.py for how they are watched). The judge computes the expected results itself and
weighs the messages against the algorithm's cost. Each check gets a fresh process group of
its own, so code that hangs or leaves messages behind spoils only its own check.
Observations travel through the launcher's key-value store (not the process group, which a
bad check may have broken); rank 0 writes them for the judge.

    torchrun --nproc-per-node=3 tests/grading/workers/lesson4_checks.py [--only fix_hang]

--submissions A,B,... grades several submission folders in one job, one block of lines
after `### submission A` each (the project's own tests use it to grade many wrong answers
with one launch).
"""

import argparse
import signal
import sys
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from common import (
    RANK,
    WORLD,
    as_data,
    launcher_store,
    observe_checks,
    one_line,
    select_submission,
    submissions_to_grade,
    worker_arguments,
    write_observations,
)
from traffic import Traffic, collectives_refused

GROUP_TIMEOUT = timedelta(seconds=10)   # a check's process group: a stuck call fails after this
HANG_TIMEOUT = timedelta(seconds=4)     # the fix_hang check: a wrong fix must fail fast
ALARM_S = 30                            # a Python-level endless loop in a check


@contextmanager
def point_to_point_only(record: dict):
    """Every ready-made collective raises meanwhile; notes in `record` the messages this rank
    sent and received, and the collectives that were called (and their errors caught)."""
    refused = []
    with collectives_refused(refused), Traffic() as seen:
        yield seen
    record["refused"] = list(refused)
    record["messages"] = [tuple(m) for m in seen.messages]


def data(seed, shape, dtype, rank=RANK):
    g = torch.Generator().manual_seed(1000 * seed + 17 * rank + 5)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


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
        record = {}
        with point_to_point_only(record):
            ex.ring_all_reduce(got)
        cases.append(dict(record, got=got, in_place=got.data_ptr() == pointer))
    return cases


# --- l4_all_gather --------------------------------------------------------------------------

GATHER_CASES = [((3,), torch.float32), ((2, 2), torch.float32), ((1,), torch.float32),
                ((5,), torch.int64)]


def observe_all_gather(ex):
    cases = []
    for i, (shape, dtype) in enumerate(GATHER_CASES):
        mine = data(10 + i, shape, dtype)
        got = [torch.zeros_like(mine) for _ in range(WORLD)]
        record = {}
        with point_to_point_only(record):
            ex.all_gather_p2p(got, mine.clone())
        cases.append(dict(record, got=got))
    record = {}
    with point_to_point_only(record):
        too_many = raised_value_error(lambda: ex.all_gather_p2p(
            [torch.zeros(3) for _ in range(WORLD + 1)], torch.zeros(3)))
    return {"cases": cases, "too_many_refused": too_many}


# --- l4_broadcast_tree ----------------------------------------------------------------------

def broadcast_roots(world):
    return sorted({0, world - 1, world // 2})


BROADCAST_SHAPES = [((5,), torch.float32), ((2, 3), torch.int64)]


def observe_broadcast_tree(ex):
    results = []
    for i, src in enumerate(broadcast_roots(WORLD)):
        for shape, dtype in BROADCAST_SHAPES:
            got = data(20 + i, shape, dtype)
            record = {}
            with point_to_point_only(record):
                ex.tree_broadcast(got, src)
            results.append(dict(record, got=got))
    record = {}
    with point_to_point_only(record):
        bad_root = raised_value_error(lambda: ex.tree_broadcast(torch.zeros(2), WORLD))
    return {"results": results, "bad_root_refused": bad_root}


def observe_broadcast_tree_shape(ex):
    """From roots W-1 and 0: the result and the messages of each rank."""
    runs = []
    for src in sorted({WORLD - 1, 0}):
        got = data(30 + src, (4,), torch.float32)
        record = {}
        with point_to_point_only(record):
            ex.tree_broadcast(got, src)
        runs.append(dict(record, src=src, got=got))
    return runs


# --- l4_node_groups -------------------------------------------------------------------------

def groups_it_asks_for(ex):
    """The rank lists node_group() passes to dist.new_group, found without making groups."""
    asked = []

    def note(ranks=None, *args, **kwargs):
        asked.append(sorted(ranks) if ranks is not None else "all")

    real = dist.new_group
    dist.new_group = note  # the same function as torch.distributed.distributed_c10d's
    c10d.new_group = note
    try:
        ex.node_group(timeout=GROUP_TIMEOUT)
    except Exception:
        pass  # it wanted a real group back; the real call below will tell
    finally:
        dist.new_group = c10d.new_group = real
    return asked


def observe_node_groups(ex):
    asked = groups_it_asks_for(ex)
    # Processes that create different groups, or in a different order, mix up each other's
    # connections and hang: compared first (the judge), before the real groups are made.
    asked_everywhere = [None] * WORLD
    dist.all_gather_object(asked_everywhere, asked)
    if any(a != asked_everywhere[0] for a in asked_everywhere):
        return {"asked": asked}
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
    return {"asked": asked, "ranks": ranks, "total": total.item(), "leader": leader,
            "last_two": last_two}


# --- l4_fix_hang ----------------------------------------------------------------------------

def observe_fix_hang(ex):
    loss = torch.tensor(1.5 + RANK)
    kept = loss.clone()
    result = ex.report_loss(loss, RANK)
    # Every rank must come out of report_loss in step with the others: one more collective.
    after = torch.ones(1)
    dist.all_reduce(after)
    return {"unchanged": torch.equal(loss, kept),
            "result": None if result is None else float(result), "after": after.item()}


CHECKS = {
    "ring_allreduce": (observe_ring_allreduce, GROUP_TIMEOUT),
    "all_gather": (observe_all_gather, GROUP_TIMEOUT),
    "broadcast_tree": (observe_broadcast_tree, GROUP_TIMEOUT),
    "broadcast_tree_shape": (observe_broadcast_tree_shape, GROUP_TIMEOUT),
    "node_groups": (observe_node_groups, GROUP_TIMEOUT),
    "fix_hang": (observe_fix_hang, HANG_TIMEOUT),  # last: a wrong fix may break its group
}


def observe_within_alarm(fn, ex) -> dict:
    def alarm(signum, frame):
        raise TimeoutError(f"still running after {ALARM_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(ALARM_S)
    try:
        try:
            return {"data": as_data(fn(ex))}
        finally:  # at once: no alarm may interrupt the reporting below
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    except NotImplementedError:
        return {"error": f"rank {RANK}: not implemented"}
    except BaseException as error:  # the code under test may raise anything, even SystemExit
        return {"error": f"rank {RANK}: {one_line(error)}"}


def run_check(name, ex, import_error) -> dict:
    if import_error:
        return {"error": f"rank {RANK}: {import_error}"}
    return observe_within_alarm(CHECKS[name][0], ex)


def main():
    parser = argparse.ArgumentParser(description="lesson 4 grading checks")
    parser.add_argument("--only", default="", help="comma-separated check names")
    parser.add_argument("--submissions", default="",
                        help="comma-separated submission folders to grade one after another")
    args, _ = parser.parse_known_args()
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        sys.exit(f"error: unknown check(s) {unknown}; known: {', '.join(CHECKS)}")
    checks = worker_arguments("lesson 4 grading checks", {n: CHECKS[n] for n in names}).checks
    store = launcher_store()
    for i, submission in enumerate(submissions_to_grade(args.submissions)):
        select_submission(submission, store, tag=str(i))
        write_observations(observe_checks(store, str(i), 4, list(checks),
                                          lambda name: CHECKS[name][1], i, run_check), i)


if __name__ == "__main__":
    main()
