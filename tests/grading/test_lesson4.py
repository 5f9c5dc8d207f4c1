"""Grading tests for lesson 4: collectives built from send/recv, node groups, a hang to fix.

A one-process world runs in the submission's process (the trivial case, and a quick first
call that lets an unfinished exercise fail before any job is started). Then each check of
workers/lesson4_checks.py runs at each world size (2 and 3 on one node, 4 as two simulated
nodes of 2) as a relayed job: every rank in a sandbox of its own, and the relay, in this
process, the only road between them (ddpcourse/course/relay.py). The ranks report what the
submission returned; the relay, what they sent and asked for. The judges below decide, here.

The exercises built from messages are graded twice: the result (the relay refuses every
ready-made collective meanwhile), and, for most of the points, the mechanism: the messages
each rank sent, their peers, sizes and number, against the algorithm's cost, as the relay
carried them. Each rank's inputs come from a secret of its own, so the numbers must travel.
"""


import math

import pytest
import torch

from ddpcourse.course.jobs import graded, relayed_report, verdict
from ddpcourse.course.probes import lesson4_data

JOBS = {}  # no torchrun job: every check is a relayed job of its own (relayed below)
# world size -> (processes per node, nodes): 4 is two simulated nodes of two
WORLDS = {2: (2, 1), 3: (3, 1), 4: (2, 2)}
# The checks of exercises built from send and recv: the relay refuses every collective.
POINT_TO_POINT = {"ring_allreduce", "all_gather", "broadcast_tree", "broadcast_tree_shape"}
_secrets: list[int] = []  # the ranks' secrets of the job being judged (data below)
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")


@pytest.fixture(scope="module")
def ex():
    yield from graded(4)


@pytest.fixture(scope="module")
def world_of_one(ex):
    """A one-process gloo world in the submission's process (no network, no launcher)."""
    with ex.world_of_one():
        yield


@pytest.fixture
def one_node_env(ex):
    """What torchrun would set for a one-process job, for node_group() in the submission's
    process."""
    with ex.options(env=dict(zip(LAUNCHER_VARIABLES, ("0", "0", "1", "1", "0"), strict=True))):
        yield


def assert_check_passed(check: str, world_size: int):
    """The lesson 4 job at `world_size` (launched once, shared by every test), judged here
    from what its ranks did."""
    per_node, nodes = WORLDS[world_size]
    verdicts = {
        "ring_allreduce_sum": ("ring_allreduce", per_rank(judge_ring_sum)),
        "ring_allreduce": ("ring_allreduce", per_rank(judge_ring)),
        "all_gather": ("all_gather", per_rank(judge_all_gather)),
        "all_gather_traffic": ("all_gather", per_rank(judge_all_gather_traffic)),
        "broadcast_tree": ("broadcast_tree", per_rank(judge_broadcast_tree)),
        "broadcast_tree_shape": ("broadcast_tree_shape", judge_broadcast_tree_shape),
        "node_groups": ("node_groups", lambda seen: judge_node_groups(seen, per_node)),
        "fix_hang": ("fix_hang", per_rank(judge_fix_hang))}
    report = relayed_report("lesson4_checks.py", verdicts, check, per_node, nodes,
                            secrets=_secrets,
                            refuse_collectives=verdicts[check][0] in POINT_TO_POINT)
    line = verdict(report, check)
    assert line == f"{check}: ok on {world_size} ranks", line


# --- the job's judges ------------------------------------------------------------------------

class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def per_rank(judge):
    """A judge of one rank's observation (rank, world, observation) that stops at its first
    failed expectation, made a judge of every rank's."""
    def judge_all(seen):
        problems = []
        for rank, observed in enumerate(seen):
            try:
                judge(rank, len(seen), observed)
            except CheckFailed as failure:
                problems.append(f"rank {rank}: {failure}")
            except (KeyError, TypeError, IndexError, AttributeError, ValueError) as error:
                problems.append(f"rank {rank}: unexpected observation ({error!r})")
        return problems, ""
    return judge_all


def data(seed, shape, dtype, rank):
    """Rank `rank`'s input, as workers/lesson4_checks.py makes it from that rank's secret."""
    return lesson4_data(_secrets[rank], seed, shape, dtype)


def same(got, want, what):
    ok = isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
    if ok:
        ok = torch.allclose(got, want, rtol=1e-5, atol=1e-5) if want.is_floating_point() \
            else torch.equal(got, want)
    shown = got.flatten()[:6].tolist() if isinstance(got, torch.Tensor) else got
    expect(ok, f"{what}: got {shown}..., expected {want.flatten()[:6].tolist()}...")


def no_collective_used(record, what):
    refused = record["refused"]
    expect(not refused, f"{what}: {refused[0] if refused else ''} was called (and its error "
                        "caught): build this one from send/recv")


def messages(record, kind):
    """(peer, numel, nbytes) of the messages of `kind` ("send" or "recv") in a record."""
    found = []
    for message in record["messages"]:
        expect(isinstance(message, tuple) and len(message) == 4, "unreadable message log")
        if message[0] == kind:
            found.append(message[1:])
    return found


def ring_cases(world):
    return [((1,), torch.float32), ((7,), torch.float32), ((1000,), torch.float32),
            ((3, 5), torch.float32), ((world + 1,), torch.int64), ((2, 3, 2), torch.int64),
            ((6 * world + 1, 4), torch.float64)]


def judge_ring_sum(rank, world, cases):
    expect(len(cases) == len(ring_cases(world)), "not every case was run")
    for i, ((shape, dtype), case) in enumerate(zip(ring_cases(world), cases, strict=True)):
        what = f"ring_all_reduce of a {tuple(shape)} {dtype} tensor"
        no_collective_used(case, what)
        before, after = case["pointers"]
        expect(before == after, f"{what}: the tensor was replaced, not summed in place")
        same(case["got"], sum(data(i, shape, dtype, r) for r in range(world)), what)


def judge_ring(rank, world, cases):
    """The ring itself: the right sum, and on every rank the messages of a ring. Rank r sends
    only to r+1 and receives only from r-1 (mod W), one message each way in each of the 2(W-1)
    steps (fewer when some chunks are empty); each message is one chunk, numel/W elements
    (rounded up or down), so a rank sends 2(W-1)/W of the tensor in all."""
    judge_ring_sum(rank, world, cases)
    for (shape, dtype), case in zip(ring_cases(world), cases, strict=True):
        what = f"ring_all_reduce of a {tuple(shape)} {dtype} tensor"
        right, left = (rank + 1) % world, (rank - 1) % world
        sent, received = messages(case, "send"), messages(case, "recv")
        expect({m[0] for m in sent} <= {right} and {m[0] for m in received} <= {left},
               f"{what}: rank {rank} sent to ranks {sorted({m[0] for m in sent}, key=str)} and "
               f"received from {sorted({m[0] for m in received}, key=str)}; in a ring it sends "
               f"only to {right} and receives only from {left}")
        steps = 2 * (world - 1)
        n = math.prod(shape)
        size = torch.tensor([], dtype=dtype).element_size()
        if n >= world:
            expect(len(sent) == len(received) == steps,
                   f"{what}: rank {rank} sent {len(sent)} and received {len(received)} "
                   f"messages; a ring all-reduce takes {steps} steps of one message each way")
        else:
            expect(len(sent) <= steps and len(received) <= steps,
                   f"{what}: rank {rank} sent {len(sent)} messages, more than the {steps} steps "
                   "of a ring")
        chunk = math.ceil(n / world) * size
        biggest = max((m[2] for m in sent + received), default=0)
        expect(biggest <= chunk,
               f"{what}: rank {rank} passed a message of {biggest} bytes; in a ring each "
               f"message is one chunk, numel/W = {n}/{world} elements, at most {chunk} bytes "
               "(whole tensors passed round the ring cost W/2 times the bandwidth)")
        total = sum(m[2] for m in sent)
        low, high = steps * (n // world) * size, steps * chunk
        expect(low <= total <= high,
               f"{what}: rank {rank} sent {total} bytes in all; a ring sends 2(W-1)/W of the "
               f"tensor, {low} to {high} bytes")


GATHER_CASES = [((3,), torch.float32), ((2, 2), torch.float32), ((1,), torch.float32),
                ((5,), torch.int64)]


def judge_all_gather(rank, world, observed):
    cases = observed["cases"]
    expect(len(cases) == len(GATHER_CASES), "not every case was run")
    for i, ((shape, dtype), case) in enumerate(zip(GATHER_CASES, cases, strict=True)):
        what = f"all_gather_p2p of {tuple(shape)} {dtype}"
        no_collective_used(case, what)
        expect(isinstance(case["got"], list) and len(case["got"]) == world,
               f"{what}: the output list changed length")
        for r in range(world):
            same(case["got"][r], data(10 + i, shape, dtype, r), f"{what}: rank {r}'s entry")
    expect(observed["too_many_refused"] is True,
           "a list with one tensor too many was accepted (expected ValueError)")


def judge_all_gather_traffic(rank, world, observed):
    """An all-gather's cost: every rank sends and receives W-1 tensors' worth, no more (a
    ring, a direct exchange and recursive doubling all do); relaying every tensor through
    one rank costs that rank W-1 times as much."""
    judge_all_gather(rank, world, observed)
    for (shape, dtype), case in zip(GATHER_CASES, observed["cases"], strict=True):
        what = f"all_gather_p2p of {tuple(shape)} {dtype}"
        need = (world - 1) * math.prod(shape) * torch.tensor([], dtype=dtype).element_size()
        for kind in ("send", "recv"):
            found = messages(case, kind)
            total = sum(m[2] for m in found)
            expect(total == need,
                   f"{what}: rank {rank} {kind} {total} bytes in {len(found)} messages; in an "
                   f"all-gather every rank sends and receives (W-1) tensors, {need} bytes")


BROADCAST_SHAPES = [((5,), torch.float32), ((2, 3), torch.int64)]


def judge_broadcast_tree(rank, world, observed):
    results = iter(observed["results"])
    for i, src in enumerate(sorted({0, world - 1, world // 2})):
        for shape, dtype in BROADCAST_SHAPES:
            what = f"tree_broadcast from rank {src} of {tuple(shape)} {dtype}"
            result = next(results, None)
            expect(result is not None, "not every case was run")
            no_collective_used(result, what)
            same(result["got"], data(20 + i, shape, dtype, src), what)
    expect(observed["bad_root_refused"] is True,
           f"src={world} (no such rank) was accepted (expected ValueError)")


def judge_broadcast_tree_shape(seen):
    """The right result, along a tree: each rank other than the root receives the tensor
    exactly once, no rank sends more than ceil(log2 W) messages (a star's root sends W-1),
    and no rank is more than ceil(log2 W) hops from the root (a chain root -> a -> b -> c is
    too deep at W = 4)."""
    world = len(seen)
    limit = max(1, math.ceil(math.log2(world))) if world > 1 else 0
    try:
        for run, src in enumerate(sorted({world - 1, 0})):
            records = [observed[run] for observed in seen]
            for r, record in enumerate(records):
                expect(record["src"] == src, "the runs are out of order")
                no_collective_used(record, f"tree_broadcast from rank {src}")
                same(record["got"], data(30 + src, (4,), torch.float32, src),
                     f"tree_broadcast from rank {src} (rank {r})")
            sent = [len(messages(record, "send")) for record in records]
            parent = {}
            for r, record in enumerate(records):
                sources = [m[0] for m in messages(record, "recv")]
                expect(len(sources) == (0 if r == src else 1),
                       f"root {src}: rank {r} received {len(sources)} messages, expected "
                       + ("none (it is the root)" if r == src else "exactly one"))
                if r != src:
                    expect(sources[0] is not None, f"root {src}: rank {r} received from any "
                                                   "source; name the rank it receives from")
                    parent[r] = sources[0]
                sizes = {m[2] for m in messages(record, "send") + messages(record, "recv")}
                expect(sizes <= {16}, f"root {src}: rank {r} passed messages of "
                                      f"{sorted(sizes)} bytes; each message of a broadcast is "
                                      "the whole tensor, 16 bytes")
            expect(max(sent) <= limit, f"root {src}: messages sent per rank {sent}; a tree "
                                       f"sends at most ceil(log2 W) = {limit} from any one rank")
            for r in parent:
                hops, at = 0, r
                while at != src and hops <= world:
                    at, hops = parent.get(at, src), hops + 1
                expect(hops <= limit, f"root {src}: rank {r} got the data after {hops} hops; "
                                      f"in a tree no rank is more than ceil(log2 W) = {limit} "
                                      "hops away")
    except CheckFailed as failure:
        return [str(failure)], ""
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as error:
        return [f"unexpected observation ({error!r})"], ""
    return [], ""


def judge_node_groups(seen, per_node):
    world, problems = len(seen), []
    for rank, observed in enumerate(seen):
        node = rank // per_node
        mates = list(range(node * per_node, (node + 1) * per_node))
        try:
            expect(observed["ranks"] == mates, f"rank {rank} on node {node} got a group of "
                                               f"ranks {observed['ranks']}, expected {mates}")
            expect(observed["total"] == sum(mates), f"a sum over the node group gave "
                                                    f"{observed['total']}, expected {sum(mates)}")
            for dtype, got in zip((torch.float32, torch.int64), observed["leader"], strict=True):
                same(got, torch.tensor([100 + mates[0], 7], dtype=dtype),
                     f"node_leader_broadcast on rank {rank} (node {node}, leader rank "
                     f"{mates[0]})")
            if world >= 3 and rank >= world - 2:
                same(observed["last_two"], torch.tensor([100 + world - 2, 7]),
                     f"node_leader_broadcast on rank {rank} in a group of ranks {world - 2} "
                     f"and {world - 1} (leader: rank {world - 2})")
        except CheckFailed as failure:
            problems.append(f"rank {rank}: {failure}")
        except (KeyError, TypeError, IndexError, ValueError) as error:
            problems.append(f"rank {rank}: unexpected observation ({error!r})")
    return problems, ""


def judge_fix_hang(rank, world, observed):
    expect(torch.equal(observed["loss"], torch.tensor(1.5 + rank)),
           "report_loss changed the caller's loss")
    if rank == 0:
        mean = sum(1.5 + r for r in range(world)) / world
        result = observed["result"]
        expect(isinstance(result, float) and abs(result - mean) < 1e-5,
               f"rank 0 returned {result}, the mean loss is {mean}")
    expect(observed["after"] == world, "after report_loss the ranks no longer agree on the "
                                       f"order of collectives (a sum of ones gave "
                                       f"{observed['after']})")


# --- l4_ring_allreduce ----------------------------------------------------------------------

@pytest.mark.l4_ring_allreduce
@pytest.mark.points(1)
def test_ring_allreduce_world_of_one(ex, world_of_one):
    for x in (torch.randn(7), torch.arange(12).reshape(3, 4)):
        after, returned_it = ex.probe("ring_all_reduce_once", x)
        assert torch.equal(after, x)  # the sum over one rank is the tensor itself
        assert returned_it is True


@pytest.mark.l4_ring_allreduce
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_allreduce_matches_all_reduce(ex, world_of_one, world_size):
    """The sums, any shape and dtype, computed with every ready-made collective refused."""
    ex.ring_all_reduce(torch.zeros(3))  # fail fast, before paying for a launch
    assert_check_passed("ring_allreduce_sum", world_size)


@pytest.mark.l4_ring_allreduce
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_allreduce_sends_chunks_round_the_ring(ex, world_of_one, world_size):
    """The right sums by a ring's messages: only to rank r+1 and from r-1, 2(W-1) steps, each
    message one chunk of about numel/W elements, 2(W-1)/W of the tensor sent per rank."""
    ex.ring_all_reduce(torch.zeros(3))
    assert_check_passed("ring_allreduce", world_size)


# --- l4_all_gather --------------------------------------------------------------------------

@pytest.mark.l4_all_gather
@pytest.mark.points(1)
def test_all_gather_world_of_one(ex, world_of_one):
    x = torch.tensor([1.0, 2.0, 3.0])
    out = ex.probe("all_gather_once", [torch.zeros(3)], x)
    assert isinstance(out[0], torch.Tensor) and torch.equal(out[0], x)
    with pytest.raises(ValueError):
        ex.all_gather_p2p([torch.zeros(3), torch.zeros(3)], x)


@pytest.mark.l4_all_gather
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_all_gather_matches_dist_all_gather(ex, world_of_one, world_size):
    ex.all_gather_p2p([torch.zeros(2)], torch.ones(2))
    assert_check_passed("all_gather", world_size)


@pytest.mark.l4_all_gather
@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [3, 4])
def test_all_gather_sends_each_tensor_once_per_rank(ex, world_of_one, world_size):
    """The right lists, at an all-gather's cost: every rank sends and receives W-1 tensors'
    worth, no more (at W = 2 a relay through one rank costs no more, so not graded there)."""
    ex.all_gather_p2p([torch.zeros(2)], torch.ones(2))
    assert_check_passed("all_gather_traffic", world_size)


# --- l4_broadcast_tree ----------------------------------------------------------------------

@pytest.mark.l4_broadcast_tree
@pytest.mark.points(1)
def test_broadcast_tree_world_of_one(ex, world_of_one):
    x = torch.tensor([4.0, 5.0])
    assert torch.equal(ex.probe("tree_broadcast_once", x, 0), torch.tensor([4.0, 5.0]))
    for bad_root in (1, -1):
        with pytest.raises(ValueError):
            ex.tree_broadcast(x, bad_root)


@pytest.mark.l4_broadcast_tree
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_broadcast_tree_matches_broadcast_from_any_root(ex, world_of_one, world_size):
    ex.tree_broadcast(torch.zeros(2), 0)
    assert_check_passed("broadcast_tree", world_size)


@pytest.mark.l4_broadcast_tree
@pytest.mark.points(5)
def test_broadcast_is_a_tree_not_a_star_or_a_chain(ex, world_of_one):
    """The right result along a tree: with 4 ranks no rank sends more than 2 messages (a
    star's root sends 3) and none is more than 2 hops from the root (a chain's last is 3)."""
    ex.tree_broadcast(torch.zeros(2), 0)
    assert_check_passed("broadcast_tree_shape", 4)


# --- l4_node_groups -------------------------------------------------------------------------

@pytest.mark.l4_node_groups
@pytest.mark.points(1)
def test_node_group_world_of_one(ex, world_of_one, one_node_env):
    ranks, x = ex.probe("node_group_once")
    assert ranks == [0]
    assert isinstance(x, torch.Tensor) and x.tolist() == [3.0]


@pytest.mark.l4_node_groups
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_node_groups_one_node(ex, world_of_one, one_node_env, world_size):
    """One node: its group and its leader's broadcast; at W = 3 also a broadcast in a group
    of ranks 1 and 2, whose leader is global rank 1 (broadcast's src is a global rank)."""
    ex.node_leader_broadcast(torch.zeros(1), ex.node_group())
    assert_check_passed("node_groups", world_size)


@pytest.mark.l4_node_groups
@pytest.mark.points(4)
def test_node_groups_two_simulated_nodes(ex, world_of_one, one_node_env):
    """2 nodes x 2 processes: ranks 0,1 and 2,3 each sum and broadcast within their node, so
    every process must create both groups, and node 1's leader is global rank 2."""
    ex.node_leader_broadcast(torch.zeros(1), ex.node_group())
    assert_check_passed("node_groups", 4)


# --- l4_fix_hang ----------------------------------------------------------------------------

@pytest.mark.l4_fix_hang
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_report_loss_no_longer_hangs(ex, world_of_one, world_size):
    """Every rank calls report_loss; a wrong fix fails within seconds (a 4 s group timeout)."""
    ex.report_loss(torch.tensor(2.0), 0)
    assert_check_passed("fix_hang", world_size)
