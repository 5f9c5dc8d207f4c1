"""Run under torchrun by the lesson 4 grading tests: every lesson 4 check in one job.

Each check gets a fresh process group of its own, so code that hangs or leaves messages
behind spoils only its own check. Verdicts travel through the launcher's key-value store
(not the process group, which a bad check may have broken), and rank 0 prints one line per
check, e.g. `ring_allreduce W=3: ok` or `all_gather W=3: FAILED: rank 1: ...`, then
`lesson 4 checks done`.

    torchrun --nproc-per-node=3 tests/grading/workers/lesson4_checks.py [--only fix_hang]
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

from ddpcourse.grading import load_exercises

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
GROUP_TIMEOUT = timedelta(seconds=10)   # a check's process group: a stuck call fails after this
HANG_TIMEOUT = timedelta(seconds=4)     # the fix_hang check: a wrong fix must fail fast
ALARM_S = 30                            # a Python-level endless loop in a check
VERDICT_WAIT = timedelta(seconds=60)    # how long ranks wait for each other's verdicts

# The ready-made collectives that the point-to-point exercises must not use.
COLLECTIVES = ["all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
               "broadcast", "reduce", "reduce_scatter", "reduce_scatter_tensor",
               "reduce_scatter_single", "gather", "scatter", "all_to_all", "all_to_all_single",
               "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list", "all_reduce_coalesced"]


class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


# The same at the process-group level, where every dist.* collective ends up: this also
# stops a collective imported under another name before the check began.
PG_COLLECTIVES = [name for name in dir(c10d.ProcessGroup) if not name.startswith("__")
                  and any(word in name for word in ("all", "broadcast", "reduce", "gather",
                                                    "scatter"))]


@contextmanager
def collectives_forbidden():
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    # vars(), not getattr: these are pybind11 method descriptors, put back exactly as found
    saved_pg = {name: vars(c10d.ProcessGroup)[name] for name in PG_COLLECTIVES}

    def forbidden(name):
        def call(*args, **kwargs):
            raise CheckFailed(f"{name} was called: build this one from send/recv")
        return call

    for name in saved:
        setattr(dist, name, forbidden(f"dist.{name}"))
    for name in saved_pg:
        setattr(c10d.ProcessGroup, name, forbidden(f"a ready-made collective ({name})"))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
        for name, fn in saved_pg.items():
            setattr(c10d.ProcessGroup, name, fn)


@contextmanager
def recording_p2p(log):
    """Append ("send", peer) and ("recv", peer) to `log` for every message this rank sends or
    receives. send, isend, recv, irecv and batch_isend_irecv all reach the process group's
    send and recv methods, which are wrapped meanwhile (peer None: a receive from anyone)."""
    pg = c10d.ProcessGroup
    saved = {name: vars(pg)[name] for name in ("send", "recv", "recv_anysource")}
    send, recv, recv_any = pg.send, pg.recv, pg.recv_anysource

    def logged_send(group, tensors, dst, *args):
        log.append(("send", dst))
        return send(group, tensors, dst, *args)

    def logged_recv(group, tensors, src, *args):
        log.append(("recv", src))
        return recv(group, tensors, src, *args)

    def logged_recv_any(group, *args):
        log.append(("recv", None))
        return recv_any(group, *args)

    pg.send, pg.recv, pg.recv_anysource = logged_send, logged_recv, logged_recv_any
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(pg, name, method)


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


def check_ring_allreduce(ex):
    cases = [((1,), torch.float32), ((7,), torch.float32), ((1000,), torch.float32),
             ((3, 5), torch.float32), ((WORLD + 1,), torch.int64), ((2, 3, 2), torch.int64)]
    for i, (shape, dtype) in enumerate(cases):
        mine = data(i, shape, dtype)
        want = mine.clone()
        dist.all_reduce(want)
        got = mine.clone()
        pointer = got.data_ptr()
        log = []
        with collectives_forbidden(), recording_p2p(log):
            ex.ring_all_reduce(got)
        expect(got.data_ptr() == pointer, "the tensor was replaced, not summed in place")
        same(got, want, f"ring_all_reduce of a {tuple(shape)} {dtype} tensor")
        expect_ring_traffic(log, got.numel(), f"ring_all_reduce of a {tuple(shape)} tensor")


def expect_ring_traffic(log, numel, what):
    """A ring: rank r sends only to r+1 and receives only from r-1 (mod W), one message
    each way in each of the 2(W-1) steps (fewer when some chunks are empty)."""
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    sent = [peer for kind, peer in log if kind == "send"]
    received = [peer for kind, peer in log if kind == "recv"]
    expect(set(sent) <= {right} and set(received) <= {left},
           f"{what}: rank {RANK} sent to ranks {sorted(set(sent))} and received from "
           f"{sorted(set(received), key=str)}; in a ring it sends only to {right} and receives "
           f"only from {left}")
    steps = 2 * (WORLD - 1)
    if numel >= WORLD:
        expect(len(sent) == len(received) == steps,
               f"{what}: rank {RANK} sent {len(sent)} and received {len(received)} messages; "
               f"a ring all-reduce takes {steps} steps of one message each way")
    else:
        expect(len(sent) <= steps and len(received) <= steps,
               f"{what}: rank {RANK} sent {len(sent)} messages, more than the {steps} steps "
               "of a ring")


def check_all_gather(ex):
    cases = [((3,), torch.float32), ((2, 2), torch.float32), ((1,), torch.float32),
             ((5,), torch.int64)]
    for i, (shape, dtype) in enumerate(cases):
        mine = data(10 + i, shape, dtype)
        want = [torch.zeros_like(mine) for _ in range(WORLD)]
        dist.all_gather(want, mine)
        got = [torch.zeros_like(mine) for _ in range(WORLD)]
        with collectives_forbidden():
            ex.all_gather_p2p(got, mine.clone())
        for r in range(WORLD):
            same(got[r], want[r], f"all_gather_p2p of {tuple(shape)} {dtype}: rank {r}'s entry")
    try:
        with collectives_forbidden():
            ex.all_gather_p2p([torch.zeros(3) for _ in range(WORLD + 1)], torch.zeros(3))
    except ValueError:
        pass
    else:
        raise CheckFailed("a list with one tensor too many was accepted (expected ValueError)")


def check_broadcast_tree(ex):
    roots = sorted({0, WORLD - 1, WORLD // 2})
    for i, src in enumerate(roots):
        for shape, dtype in [((5,), torch.float32), ((2, 3), torch.int64)]:
            mine = data(20 + i, shape, dtype)
            want = mine.clone()
            dist.broadcast(want, src=src)
            got = mine.clone()
            with collectives_forbidden():
                ex.tree_broadcast(got, src)
            same(got, want, f"tree_broadcast from rank {src} of {tuple(shape)} {dtype}")
    try:
        with collectives_forbidden():
            ex.tree_broadcast(torch.zeros(2), WORLD)
    except ValueError:
        pass
    else:
        raise CheckFailed(f"src={WORLD} (no such rank) was accepted (expected ValueError)")


def check_broadcast_tree_shape(ex):
    """Who sent to whom: each rank other than the root receives exactly once, no rank sends
    more than ceil(log2 W) messages, and no rank is more than ceil(log2 W) hops from the
    root (a chain root -> a -> b -> c is too deep at W = 4)."""
    limit = max(1, math.ceil(math.log2(WORLD))) if WORLD > 1 else 0
    for src in sorted({WORLD - 1, 0}):
        log = []
        got = data(30 + src, (4,), torch.float32)
        with collectives_forbidden(), recording_p2p(log):
            ex.tree_broadcast(got, src)
        logs = [None] * WORLD
        dist.all_gather_object(logs, log)
        sent = [sum(kind == "send" for kind, _ in lg) for lg in logs]
        parent = {}
        for r, lg in enumerate(logs):
            sources = [peer for kind, peer in lg if kind == "recv"]
            expect(len(sources) == (0 if r == src else 1),
                   f"root {src}: rank {r} received {len(sources)} messages, expected "
                   + ("none (it is the root)" if r == src else "exactly one"))
            if r != src:
                expect(sources[0] is not None, f"root {src}: rank {r} received from any "
                                               "source; name the rank it receives from")
                parent[r] = sources[0]
        expect(max(sent) <= limit, f"root {src}: messages sent per rank {sent}; a tree sends "
                                   f"at most ceil(log2 W) = {limit} from any one rank")
        for r in parent:
            hops, at = 0, r
            while at != src and hops <= WORLD:
                at, hops = parent.get(at, src), hops + 1
            expect(hops <= limit, f"root {src}: rank {r} got the data after {hops} hops; in a "
                                  f"tree no rank is more than ceil(log2 W) = {limit} hops away")


def check_node_groups(ex):
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    node = int(os.environ["GROUP_RANK"])
    mates = list(range(node * per_node, (node + 1) * per_node))
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
    "ring_allreduce": (check_ring_allreduce, GROUP_TIMEOUT),
    "all_gather": (check_all_gather, GROUP_TIMEOUT),
    "broadcast_tree": (check_broadcast_tree, GROUP_TIMEOUT),
    "broadcast_tree_shape": (check_broadcast_tree_shape, GROUP_TIMEOUT),
    "node_groups": (check_node_groups, GROUP_TIMEOUT),
    "fix_hang": (check_fix_hang, HANG_TIMEOUT),  # last: a wrong fix may break its group
}


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:300]


def run_check(fn, ex) -> str:
    def alarm(signum, frame):
        raise TimeoutError(f"still running after {ALARM_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(ALARM_S)
    try:
        fn(ex)
        return "ok"
    except NotImplementedError:
        return "not implemented"
    except CheckFailed as failure:
        return str(failure)
    except BaseException as error:  # the code under test may raise anything, even SystemExit
        return one_line(error)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def main():
    parser = argparse.ArgumentParser(description="lesson 4 grading checks")
    parser.add_argument("--only", default="", help="comma-separated check names")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        sys.exit(f"error: unknown check(s) {unknown}; known: {', '.join(CHECKS)}")
    try:
        ex, import_error = load_exercises(4), None
    except BaseException as error:
        ex, import_error = None, f"could not import the exercises: {one_line(error)}"

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=VERDICT_WAIT)
    lines = []
    for name in names:
        fn, timeout = CHECKS[name]
        dist.init_process_group("gloo", store=dist.PrefixStore(f"lesson4/{name}", store),
                                rank=RANK, world_size=WORLD, timeout=timeout)
        verdict = import_error or run_check(fn, ex)
        keys = [f"lesson4-verdict/{name}/{r}" for r in range(WORLD)]
        store.set(keys[RANK], verdict)
        try:
            store.wait(keys, VERDICT_WAIT)
            verdicts = [store.get(k).decode() for k in keys]
        except Exception:  # a rank died or is stuck: report what arrived
            verdicts = [store.get(k).decode() if store.check([k]) else "no verdict (stuck?)"
                        for k in keys]
        try:
            dist.destroy_process_group()
        except Exception:
            pass
        bad = {}  # verdict -> the ranks that gave it
        for r, v in enumerate(verdicts):
            if v != "ok":
                bad.setdefault(v, []).append(r)
        lines.append(f"{name} W={WORLD}: " + ("ok" if not bad else "FAILED: " + "; ".join(
            f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}: {v}"
            for v, rs in bad.items())))
    if RANK == 0:
        print("\n".join(lines))
        print("lesson 4 checks done", flush=True)


if __name__ == "__main__":
    main()
