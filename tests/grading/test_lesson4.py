"""Grading tests for lesson 4: collectives built from send/recv, node groups, a hang to fix.

A one-process world runs in this process (the trivial case, and a quick first call that
lets an unfinished exercise fail before any job is started). Then one torchrun job per
world size (2 and 3 on one node, 4 as two simulated nodes of 2) runs every check in
workers/lesson4_checks.py against the real collectives; the tests of all exercises share
that job and each asserts its own line of the job's report.

The exercises built from messages are graded twice: the result (with every ready-made
collective refused), and, for most of the points, the mechanism: the messages each rank
sent, their peers, sizes and number, against the algorithm's cost.
"""


import pytest
import torch
from jobs import Job, graded, run_job

# world size -> its job (4: two simulated nodes of two)
JOBS = {2: Job("lesson4_W2", "lesson4_checks.py", nproc=2),
        3: Job("lesson4_W3", "lesson4_checks.py", nproc=3),
        4: Job("lesson4_W4", "lesson4_checks.py", nproc=2, nnodes=2)}
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


def job(world_size: int):
    """The lesson 4 checks at `world_size`, launched once and shared by every test."""
    return run_job(JOBS[world_size])


def assert_check_passed(check: str, world_size: int):
    result = job(world_size)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith(f"{check} W=")]
    assert lines == [f"{check} W={world_size}: ok"], "\n".join(lines) or output[-3000:]


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
