"""The relay (ddpcourse/course/relay.py): the only road between a relayed job's ranks.

Each test starts W processes (no sandbox: the relay itself is under test; this file is also
the ranks' program), joins them to a Relay held by this process, and compares what the
relay computed with what one process computes. World sizes 1 to 4, odd ones included; every
wait is bounded.
"""

import os
import socket
import struct
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ddpcourse.course import relay

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # every test starts processes that import torch

TIMEOUT = timedelta(seconds=10)


def run_ranks(world: int, body, refuse: bool = False, limit: float = 40):
    """body(rank, world), a function of this module, in `world` processes (the test suite's
    interpreter: a fork of its fork server, single-threaded) joined to one relay; returns the
    relay and each rank's exit status. What a rank returns is noted to the relay."""
    hub = relay.Relay(world, refuse_collectives=refuse)
    procs = []
    for rank in range(world):
        fd = hub.rank_end(rank)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, str(fd), str(rank), str(world), body.__name__],
            pass_fds=(fd,), cwd=str(ROOT), stdin=subprocess.DEVNULL))
    hub.close_rank_ends()
    hub.start()
    deadline, codes = time.monotonic() + limit, [None] * world
    for i, proc in enumerate(procs):
        try:
            codes[i] = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes[i] = "killed after the limit"
    hub.close()
    return hub, codes


def rank_main(fd: int, rank: int, world: int, name: str) -> None:
    code = 0
    try:
        relay.join(fd, rank, world, TIMEOUT)
        relay.note(result=globals()[name](rank, world))
        dist.destroy_process_group()
    except BaseException as error:  # noqa: BLE001  reported, as a rank's end
        try:
            relay.note(error=f"{type(error).__name__}: {error}")
        except BaseException:  # noqa: BLE001
            pass
        code = 3
    os._exit(code)


def results(hub):
    return [next((n.get("result", n.get("error")) for n in notes
                  if "result" in n or "error" in n), None) for notes in hub.notes]


def inputs(rank, n=7):
    return torch.arange(n, dtype=torch.float32) * (rank + 1) + rank / 10


def collectives(rank, world):
    out = {}
    x = inputs(rank)
    dist.all_reduce(x)
    out["all_reduce"] = x
    y = inputs(rank)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    out["max"] = y
    b = inputs(rank)
    dist.broadcast(b, src=world - 1)
    out["broadcast"] = b
    gathered = [torch.zeros(7) for _ in range(world)]
    dist.all_gather(gathered, inputs(rank))
    out["all_gather"] = gathered
    flat = torch.zeros(7 * world)
    dist.all_gather_into_tensor(flat, inputs(rank))
    out["all_gather_into_tensor"] = flat
    part = torch.zeros(2)
    dist.reduce_scatter_tensor(part, torch.arange(2 * world, dtype=torch.float32) + rank)
    out["reduce_scatter_tensor"] = part
    # Uneven splits: rank r sends r+1 elements to each peer... of its own sizes.
    splits_in = [rank + 1] * world
    splits_out = [r + 1 for r in range(world)]
    received = torch.zeros(sum(splits_out))
    dist.all_to_all_single(received, torch.full((sum(splits_in),), float(rank)),
                           output_split_sizes=splits_out, input_split_sizes=splits_in)
    out["all_to_all_single"] = received
    r = inputs(rank)
    dist.reduce(r, dst=0)
    out["reduce"] = r if rank == 0 else None
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    out["objects"] = objects
    dist.barrier()
    if world > 1:
        message = torch.zeros(3)
        if rank == 0:
            for peer in range(1, world):
                dist.send(torch.full((3,), float(peer)), dst=peer)
        else:
            dist.recv(message, src=0)
        out["sent"] = message
        evens = dist.new_group([r for r in range(world) if r % 2 == 0], timeout=TIMEOUT)
        if rank % 2 == 0:
            s = torch.tensor([float(rank)])
            dist.all_reduce(s, group=evens)
            out["evens"] = s
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_relay_computes_every_collective_as_one_process_would(world):
    hub, codes = run_ranks(world, collectives)
    assert codes == [0] * world, (codes, results(hub))
    every = [inputs(r) for r in range(world)]
    for rank, got in enumerate(results(hub)):
        assert isinstance(got, dict), got
        assert torch.allclose(got["all_reduce"], sum(every))
        assert torch.equal(got["max"], torch.stack(every).max(0).values)
        assert torch.equal(got["broadcast"], every[-1])
        assert all(torch.equal(a, b) for a, b in zip(got["all_gather"], every, strict=True))
        assert torch.equal(got["all_gather_into_tensor"], torch.cat(every))
        whole = sum(torch.arange(2 * world, dtype=torch.float32) + r for r in range(world))
        assert torch.equal(got["reduce_scatter_tensor"], whole[2 * rank: 2 * rank + 2])
        assert got["all_to_all_single"].tolist() == [
            float(r) for r in range(world) for _ in range(r + 1)]
        if rank == 0:
            assert torch.allclose(got["reduce"], sum(every))
        assert got["objects"] == [{"rank": r} for r in range(world)]
        if world > 1:
            assert got["sent"].tolist() == ([0.0] * 3 if rank == 0 else [float(rank)] * 3)
            if rank % 2 == 0:
                assert got["evens"].item() == sum(r for r in range(world) if r % 2 == 0)


def ring_messages(rank, world):
    """Every rank passes its number round the ring with batch_isend_irecv, in a case."""
    relay.note(case=0)
    mine, got = torch.tensor([float(rank)] * 4), torch.zeros(4)
    ops = [dist.P2POp(dist.isend, mine, (rank + 1) % world),
           dist.P2POp(dist.irecv, got, (rank - 1) % world)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return got


@pytest.mark.timeout(60)
def test_the_relay_records_each_message_it_carried():
    hub, codes = run_ranks(3, ring_messages)
    assert codes == [0, 0, 0]
    for rank, got in enumerate(results(hub)):
        assert got.tolist() == [float((rank - 1) % 3)] * 4
        messages = [(e["kind"], e["peer"], e["nbytes"], e["case"]) for e in hub.record[rank]
                    if e["kind"] in ("send", "recv")]
        assert messages == [("send", (rank + 1) % 3, 16, 0), ("recv", (rank - 1) % 3, 16, 0)]
        received = next(e for e in hub.record[rank] if e["kind"] == "recv")
        assert received["got_from"] == (rank - 1) % 3
        assert received["digest"] == relay.digest(torch.tensor([float((rank - 1) % 3)] * 4))


def ddp_step(rank, world):
    """One backward of a DDP model over the relay, a different batch per rank."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2))
    model(torch.arange(12.0).reshape(3, 4) * (rank + 1)).sum().backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [1, 3])
def test_ddp_trains_over_the_relay_as_one_process_would(world):
    """DDP's reducer reaches the relay too (its gradients' all-reduce is the relay's):
    every rank ends with the mean of the ranks' gradients."""
    hub, codes = run_ranks(world, ddp_step)
    assert codes == [0] * world
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    for rank in range(world):
        model(torch.arange(12.0).reshape(3, 4) * (rank + 1)).sum().backward()
    want = [p.grad / world for p in model.parameters()]
    for rank, got in enumerate(results(hub)):
        assert all(torch.allclose(g, w) for g, w in zip(got, want, strict=True)), (rank, got)
        assert any(e["kind"] == "collective" and e["op"] == "allreduce"
                   for e in hub.record[rank]), hub.record[rank]


def every_route(rank, world):
    """Each road to a ready-made all-reduce, tried; what each raised."""
    import threading

    import torch.distributed._functional_collectives as funcol
    from torch.distributed.distributed_c10d import all_reduce as bound_before

    x, group = torch.ones(3), dist.group.WORLD

    def in_a_thread():
        errors = []
        thread = threading.Thread(target=lambda: errors.extend(raised(
            lambda: dist.all_reduce(x))))
        thread.start()
        thread.join(20)
        if errors:
            raise errors[0]

    def coalesced():
        with dist.distributed_c10d._coalescing_manager():
            dist.all_reduce(x)

    routes = {
        "dist.all_reduce": lambda: dist.all_reduce(x),
        "a function imported before": lambda: bound_before(x),
        "a ProcessGroup method": lambda: group.allreduce([x]).wait(),
        "the c10d operator": lambda: torch.ops.c10d.allreduce_(
            [x], group.boxed(), torch.classes.c10d.ReduceOp(), None, False)[1].wait(),
        "a backend's own method": lambda: group._get_backend(torch.device("cpu"))
        .allreduce([x]).wait(),
        "functional collectives": lambda: funcol.wait_tensor(funcol.all_reduce(x, "sum", group)),
        "torch.ops._c10d_functional": lambda: funcol.wait_tensor(
            torch.ops._c10d_functional.all_reduce(x, "sum", group.group_name)),
        "_coalescing_manager": coalesced,
        "all_gather_object": lambda: dist.all_gather_object([None] * world, 1),
        "another thread": in_a_thread,
        "a gloo group of its own": lambda: dist.all_reduce(x, group=dist.new_group(
            backend="gloo", timeout=timedelta(seconds=2))),
    }
    return {name: [f"{type(e).__name__}: {e}"[:200] for e in raised(route)]
            for name, route in routes.items()}


def raised(fn):
    try:
        fn()
    except Exception as error:  # noqa: BLE001
        return [error]
    return []


@pytest.mark.timeout(120)
def test_every_road_to_a_collective_is_refused_by_the_relay():
    """However a collective is reached (the dispatcher's other keys, a thread, a group of
    another backend), it fails: it comes to the relay, which refuses it and records the
    refusal, or it finds no road to the other ranks at all (the c10d operator finds no
    backend to run on; a gloo group has no store the other ranks share). Nothing is carried."""
    hub, codes = run_ranks(2, every_route, refuse=True)
    assert codes == [0, 0], results(hub)
    for rank, got in enumerate(results(hub)):
        not_refused = {name: errors for name, errors in got.items() if not errors}
        assert not not_refused, f"rank {rank}: these routes worked: {not_refused}"
        carried = [e for e in hub.record[rank] if e["kind"] not in ("refused", "group")]
        assert not carried, f"rank {rank}: the relay carried {carried}"
        assert sum(e["kind"] == "refused" for e in hub.record[rank]) >= 5


def ends_at_once(rank, world):
    if rank == 1:
        os._exit(0)
    started = time.monotonic()
    try:
        dist.recv(torch.zeros(2), src=1)
    except RuntimeError as error:
        return {"error": str(error), "waited": time.monotonic() - started}
    return {"error": None}


@pytest.mark.timeout(60)
def test_a_rank_that_ends_fails_what_waits_on_it_at_once():
    hub, codes = run_ranks(2, ends_at_once)
    got = results(hub)[0]
    assert got["error"] and "rank 1 ended" in got["error"], got
    assert got["waited"] < TIMEOUT.total_seconds() / 2, got
    assert hub.ended[1] == "ended"


def mismatched(rank, world):
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(2))
        else:
            dist.broadcast(torch.ones(2), src=0)
    except RuntimeError as error:
        return str(error)
    return "no error"


@pytest.mark.timeout(60)
def test_ranks_that_call_different_collectives_both_fail_with_the_reason():
    hub, codes = run_ranks(2, mismatched)
    for got in results(hub):
        assert "different collectives" in got, got


@pytest.mark.timeout(60)
@pytest.mark.parametrize("garbage", [b"\xff" * 8, struct.pack("<Q", 1 << 40),
                                     struct.pack("<Q", 5) + b"hello"])
def test_a_rank_that_writes_garbage_only_ends_itself(garbage):
    hub = relay.Relay(2)
    hub.start()
    theirs = socket.socket(fileno=os.dup(hub.rank_end(0)))
    quiet = socket.socket(fileno=os.dup(hub.rank_end(1)))  # rank 1: there, saying nothing
    hub.close_rank_ends()
    theirs.sendall(garbage)
    deadline = time.monotonic() + 10
    while hub.ended[0] is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert hub.ended[0] and "cannot read" in hub.ended[0], hub.ended
    assert hub.ended[1] is None
    theirs.close()
    quiet.close()
    hub.close()


if __name__ == "__main__":  # one rank of run_ranks
    rank_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
