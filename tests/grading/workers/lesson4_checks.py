"""Run under torchrun by the lesson 4 grading tests: every lesson 4 check in one job.

Each exercise built from messages is checked twice: for its result (compared with torch's
own collective, while every ready-made collective raises), and for its mechanism (the
messages it sent, counted and weighed against the algorithm's cost; see traffic.py for how
they are watched). Each check gets a fresh process group of its own, so code that hangs or
leaves messages behind spoils only its own check. Verdicts travel through the launcher's
key-value store (not the process group, which a bad check may have broken), and rank 0
prints one line per check, e.g. `ring_allreduce W=3: ok` or
`all_gather W=3: FAILED: rank 1: ...`, then `lesson 4 checks done`.

    torchrun --nproc-per-node=3 tests/grading/workers/lesson4_checks.py [--only fix_hang]

--submissions A,B,... grades several submission folders in one job, one block of lines
after `### submission A` each (the project's own tests use it to grade many wrong answers
with one launch).
"""

import argparse
import math
import os
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
    everyones_verdict,
    exercises_or_error,
    group_of_its_own,
    launcher_store,
    one_line,
    select_submission,
    submissions_to_grade,
)
from traffic import Traffic, collectives_refused

GROUP_TIMEOUT = timedelta(seconds=10)   # a check's process group: a stuck call fails after this
HANG_TIMEOUT = timedelta(seconds=4)     # the fix_hang check: a wrong fix must fail fast
ALARM_S = 30                            # a Python-level endless loop in a check


class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


@contextmanager
def point_to_point_only():
    """Every ready-made collective raises meanwhile; yields the Traffic that records what
    this rank sent and received."""
    refused = []
    with collectives_refused(refused), Traffic() as seen:
        yield seen
    expect(not refused, f"{refused[0] if refused else ''} was called (and its error caught): "
                        "build this one from send/recv")


def data(seed, shape, dtype):
    g = torch.Generator().manual_seed(1000 * seed + 17 * RANK + 5)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def same(got, want, what):
    if want.is_floating_point():
        ok = got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        ok = torch.equal(got, want)
    expect(ok, f"{what}: got {got.flatten()[:6].tolist()}..., expected "
               f"{want.flatten()[:6].tolist()}...")


# --- l4_ring_allreduce ----------------------------------------------------------------------

RING_CASES = [((1,), torch.float32), ((7,), torch.float32), ((1000,), torch.float32),
              ((3, 5), torch.float32), ((WORLD + 1,), torch.int64), ((2, 3, 2), torch.int64),
              ((6 * WORLD + 1, 4), torch.float64)]


def ring_all_reduce_of_case(ex, i, shape, dtype):
    """(what, result, expected, traffic) for one case: the graded function's sum, computed
    while collectives are refused, and torch's."""
    mine = data(i, shape, dtype)
    want = mine.clone()
    dist.all_reduce(want)
    got = mine.clone()
    pointer = got.data_ptr()
    with point_to_point_only() as seen:
        ex.ring_all_reduce(got)
    what = f"ring_all_reduce of a {tuple(shape)} {dtype} tensor"
    expect(got.data_ptr() == pointer, f"{what}: the tensor was replaced, not summed in place")
    same(got, want, what)
    return what, got, seen


def check_ring_allreduce_sum(ex):
    for i, (shape, dtype) in enumerate(RING_CASES):
        ring_all_reduce_of_case(ex, i, shape, dtype)


def check_ring_allreduce(ex):
    """The ring itself: the right sum, and on every rank the messages of a ring."""
    for i, (shape, dtype) in enumerate(RING_CASES):
        what, got, seen = ring_all_reduce_of_case(ex, i, shape, dtype)
        expect_ring_traffic(seen, got, what)


def expect_ring_traffic(seen, tensor, what):
    """Rank r sends only to r+1 and receives only from r-1 (mod W), one message each way in
    each of the 2(W-1) steps (fewer when some chunks are empty); each message is one chunk,
    numel/W elements (rounded up or down), so a rank sends 2(W-1)/W of the tensor in all."""
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    sent, received = seen.sent(), seen.received()
    expect({m.peer for m in sent} <= {right} and {m.peer for m in received} <= {left},
           f"{what}: rank {RANK} sent to ranks {sorted({m.peer for m in sent})} and received "
           f"from {sorted({m.peer for m in received}, key=str)}; in a ring it sends only to "
           f"{right} and receives only from {left}")
    steps = 2 * (WORLD - 1)
    n, size = tensor.numel(), tensor.element_size()
    if n >= WORLD:
        expect(len(sent) == len(received) == steps,
               f"{what}: rank {RANK} sent {len(sent)} and received {len(received)} messages; "
               f"a ring all-reduce takes {steps} steps of one message each way")
    else:
        expect(len(sent) <= steps and len(received) <= steps,
               f"{what}: rank {RANK} sent {len(sent)} messages, more than the {steps} steps "
               "of a ring")
    chunk = math.ceil(n / WORLD) * size
    biggest = max((m.nbytes for m in sent + received), default=0)
    expect(biggest <= chunk,
           f"{what}: rank {RANK} passed a message of {biggest} bytes; in a ring each message "
           f"is one chunk, numel/W = {n}/{WORLD} elements, at most {chunk} bytes (whole "
           "tensors passed round the ring cost W/2 times the bandwidth)")
    total = sum(m.nbytes for m in sent)
    low, high = steps * (n // WORLD) * size, steps * chunk
    expect(low <= total <= high,
           f"{what}: rank {RANK} sent {total} bytes in all; a ring sends 2(W-1)/W of the "
           f"tensor, {low} to {high} bytes")


# --- l4_all_gather --------------------------------------------------------------------------

GATHER_CASES = [((3,), torch.float32), ((2, 2), torch.float32), ((1,), torch.float32),
                ((5,), torch.int64)]


def all_gather_of_case(ex, i, shape, dtype):
    mine = data(10 + i, shape, dtype)
    want = [torch.zeros_like(mine) for _ in range(WORLD)]
    dist.all_gather(want, mine)
    got = [torch.zeros_like(mine) for _ in range(WORLD)]
    with point_to_point_only() as seen:
        ex.all_gather_p2p(got, mine.clone())
    what = f"all_gather_p2p of {tuple(shape)} {dtype}"
    for r in range(WORLD):
        same(got[r], want[r], f"{what}: rank {r}'s entry")
    return what, mine, seen


def check_all_gather(ex):
    for i, (shape, dtype) in enumerate(GATHER_CASES):
        all_gather_of_case(ex, i, shape, dtype)
    try:
        with point_to_point_only():
            ex.all_gather_p2p([torch.zeros(3) for _ in range(WORLD + 1)], torch.zeros(3))
    except ValueError:
        pass
    else:
        raise CheckFailed("a list with one tensor too many was accepted (expected ValueError)")


def check_all_gather_traffic(ex):
    """An all-gather's cost: every rank sends and receives W-1 tensors' worth, no more (a
    ring, a direct exchange and recursive doubling all do); relaying every tensor through
    one rank costs that rank W-1 times as much."""
    for i, (shape, dtype) in enumerate(GATHER_CASES):
        what, mine, seen = all_gather_of_case(ex, i, shape, dtype)
        need = (WORLD - 1) * mine.numel() * mine.element_size()
        for kind, messages in (("sent", seen.sent()), ("received", seen.received())):
            total = sum(m.nbytes for m in messages)
            expect(total == need,
                   f"{what}: rank {RANK} {kind} {total} bytes in {len(messages)} messages; in an "
                   f"all-gather every rank sends and receives (W-1) tensors, {need} bytes")


# --- l4_broadcast_tree ----------------------------------------------------------------------

def check_broadcast_tree(ex):
    roots = sorted({0, WORLD - 1, WORLD // 2})
    for i, src in enumerate(roots):
        for shape, dtype in [((5,), torch.float32), ((2, 3), torch.int64)]:
            mine = data(20 + i, shape, dtype)
            want = mine.clone()
            dist.broadcast(want, src=src)
            got = mine.clone()
            with point_to_point_only():
                ex.tree_broadcast(got, src)
            same(got, want, f"tree_broadcast from rank {src} of {tuple(shape)} {dtype}")
    try:
        with point_to_point_only():
            ex.tree_broadcast(torch.zeros(2), WORLD)
    except ValueError:
        pass
    else:
        raise CheckFailed(f"src={WORLD} (no such rank) was accepted (expected ValueError)")


def check_broadcast_tree_shape(ex):
    """The right result, along a tree: each rank other than the root receives the tensor
    exactly once, no rank sends more than ceil(log2 W) messages (a star's root sends W-1),
    and no rank is more than ceil(log2 W) hops from the root (a chain root -> a -> b -> c is
    too deep at W = 4)."""
    limit = max(1, math.ceil(math.log2(WORLD))) if WORLD > 1 else 0
    for src in sorted({WORLD - 1, 0}):
        mine = data(30 + src, (4,), torch.float32)
        want = mine.clone()
        dist.broadcast(want, src=src)
        got = mine.clone()
        with point_to_point_only() as seen:
            ex.tree_broadcast(got, src)
        same(got, want, f"tree_broadcast from rank {src}")
        logs = [None] * WORLD
        dist.all_gather_object(logs, [tuple(m) for m in seen.messages])
        sent = [sum(kind == "send" for kind, *_ in lg) for lg in logs]
        parent = {}
        for r, lg in enumerate(logs):
            sources = [peer for kind, peer, *_ in lg if kind == "recv"]
            expect(len(sources) == (0 if r == src else 1),
                   f"root {src}: rank {r} received {len(sources)} messages, expected "
                   + ("none (it is the root)" if r == src else "exactly one"))
            if r != src:
                expect(sources[0] is not None, f"root {src}: rank {r} received from any "
                                               "source; name the rank it receives from")
                parent[r] = sources[0]
            sizes = {nbytes for *_, nbytes in lg}
            expect(sizes <= {got.numel() * got.element_size()},
                   f"root {src}: rank {r} passed messages of {sorted(sizes)} bytes; each "
                   f"message of a broadcast is the whole tensor, {got.nbytes} bytes")
        expect(max(sent) <= limit, f"root {src}: messages sent per rank {sent}; a tree sends "
                                   f"at most ceil(log2 W) = {limit} from any one rank")
        for r in parent:
            hops, at = 0, r
            while at != src and hops <= WORLD:
                at, hops = parent.get(at, src), hops + 1
            expect(hops <= limit, f"root {src}: rank {r} got the data after {hops} hops; in a "
                                  f"tree no rank is more than ceil(log2 W) = {limit} hops away")


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


def check_node_groups(ex):
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    node = int(os.environ["GROUP_RANK"])
    mates = list(range(node * per_node, (node + 1) * per_node))
    # Processes that create different groups, or in a different order, mix up each other's
    # connections and hang: caught first, in a moment and with a clear message.
    asked = [None] * WORLD
    dist.all_gather_object(asked, groups_it_asks_for(ex))
    for r in range(WORLD):
        expect(asked[r] == asked[0],
               f"rank 0 asked dist.new_group for {asked[0]}, rank {r} for {asked[r]}: every "
               "process must create every group, in the same order")
    group = ex.node_group(timeout=GROUP_TIMEOUT)
    ranks = dist.get_process_group_ranks(group)
    expect(ranks == mates, f"rank {RANK} on node {node} got a group of ranks {ranks}, "
                           f"expected {mates}")
    total = torch.tensor([float(RANK)])
    dist.all_reduce(total, group=group)
    expect(total.item() == sum(mates), f"a sum over the node group gave {total.item():g}, "
                                       f"expected {sum(mates)}")
    for dtype in (torch.float32, torch.int64):
        mine = torch.tensor([100 + RANK, 7], dtype=dtype)
        ex.node_leader_broadcast(mine, group)
        same(mine, torch.tensor([100 + mates[0], 7], dtype=dtype),
             f"node_leader_broadcast on rank {RANK} (node {node}, leader rank {mates[0]})")
    if WORLD >= 3:
        # A group whose rank 0 is not global rank 0, even on one node: the leader is the
        # group's first process, global rank W-2 (broadcast's src is a global rank).
        last_two = dist.new_group([WORLD - 2, WORLD - 1], timeout=GROUP_TIMEOUT)
        if RANK >= WORLD - 2:
            mine = torch.tensor([100 + RANK, 7])
            ex.node_leader_broadcast(mine, last_two)
            same(mine, torch.tensor([100 + WORLD - 2, 7]),
                 f"node_leader_broadcast on rank {RANK} in a group of ranks {WORLD - 2} and "
                 f"{WORLD - 1} (leader: rank {WORLD - 2})")


# --- l4_fix_hang ----------------------------------------------------------------------------

def check_fix_hang(ex):
    loss = torch.tensor(1.5 + RANK)
    kept = loss.clone()
    result = ex.report_loss(loss, RANK)
    expect(torch.equal(loss, kept), "report_loss changed the caller's loss")
    if RANK == 0:
        mean = sum(1.5 + r for r in range(WORLD)) / WORLD
        expect(result is not None and abs(float(result) - mean) < 1e-5,
               f"rank 0 returned {result}, the mean loss is {mean}")
    # Every rank must come out of report_loss in step with the others: one more collective.
    after = torch.ones(1)
    dist.all_reduce(after)
    expect(after.item() == WORLD, "after report_loss the ranks no longer agree on the order "
                                  f"of collectives (a sum of ones gave {after.item():g})")


CHECKS = {
    "ring_allreduce_sum": (check_ring_allreduce_sum, GROUP_TIMEOUT),
    "ring_allreduce": (check_ring_allreduce, GROUP_TIMEOUT),
    "all_gather": (check_all_gather, GROUP_TIMEOUT),
    "all_gather_traffic": (check_all_gather_traffic, GROUP_TIMEOUT),
    "broadcast_tree": (check_broadcast_tree, GROUP_TIMEOUT),
    "broadcast_tree_shape": (check_broadcast_tree_shape, GROUP_TIMEOUT),
    "node_groups": (check_node_groups, GROUP_TIMEOUT),
    "fix_hang": (check_fix_hang, HANG_TIMEOUT),  # last: a wrong fix may break its group
}


def run_check(fn, ex) -> str:
    def alarm(signum, frame):
        raise TimeoutError(f"still running after {ALARM_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(ALARM_S)
    try:
        try:
            fn(ex)
        finally:  # at once: no alarm may interrupt the reporting below
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        return "ok"
    except NotImplementedError:
        return "not implemented"
    except CheckFailed as failure:
        return str(failure)
    except BaseException as error:  # the code under test may raise anything, even SystemExit
        return one_line(error)


def run_checks(names, store, tag) -> list[str]:
    """Every check in `names` on the exercises COURSE_SUBMISSION / COURSE_IMPL point at now;
    the report's lines."""
    ex, import_error = exercises_or_error(4)
    lines = []
    for name in names:
        fn, timeout = CHECKS[name]
        with group_of_its_own(store, f"lesson4/{tag}/{name}", timeout):
            verdict = import_error or run_check(fn, ex)
            verdicts = everyones_verdict(store, f"lesson4/{tag}/{name}", verdict)
        bad = {}  # verdict -> the ranks that gave it
        for r, v in enumerate(verdicts):
            if v != "ok":
                bad.setdefault(v, []).append(r)
        lines.append(f"{name} W={WORLD}: " + ("ok" if not bad else "FAILED: " + "; ".join(
            f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}: {v}"
            for v, rs in bad.items())))
    return lines


def main():
    parser = argparse.ArgumentParser(description="lesson 4 grading checks")
    parser.add_argument("--only", default="", help="comma-separated check names")
    parser.add_argument("--submissions", default="",
                        help="comma-separated submission folders to grade one after another")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        sys.exit(f"error: unknown check(s) {unknown}; known: {', '.join(CHECKS)}")
    store = launcher_store()
    for i, submission in enumerate(submissions_to_grade(args.submissions)):
        select_submission(submission, store, tag=str(i))
        lines = run_checks(names, store, tag=str(i))
        if RANK == 0:
            print("\n".join(lines))
            print("lesson 4 checks done", flush=True)


if __name__ == "__main__":
    main()
