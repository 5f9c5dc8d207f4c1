"""Grading tests for lesson 1. The expected tables are written out by hand from the reading."""

import os

import pytest

from ddpcourse.course.hidden import drawn
from ddpcourse.course.jobs import TORCHRUN_JOBS, graded, judged, verdict
from ddpcourse.topology import Process

# world size -> its job: two simulated nodes of two processes
JOBS = TORCHRUN_JOBS[1]


@pytest.fixture(scope="module")
def ex():
    yield from graded(1)


@pytest.fixture(autouse=True)
def no_course_answer(ex):
    """ddpcourse.topology.layout is the course's own answer (it draws the diagrams): an
    exercise that calls it, under any name, fails (refused in the submission's process)."""
    with ex.options(refuse=[("ddpcourse.topology", "layout",
                             "ddpcourse.topology.layout is the course's answer: write the "
                             "arithmetic yourself")]):
        yield


# --- l1_global_rank -----------------------------------------------------------------------

@pytest.mark.l1_global_rank
@pytest.mark.points(2)
def test_global_rank_two_nodes_of_four(ex):
    # The reading's 2 nodes x 4 GPUs: node 1's processes are global ranks 4..7.
    node0 = [ex.global_rank(0, g, 4) for g in range(4)]
    assert node0 == [0, 1, 2, 3], (
        f"global_rank(0, local_rank, 4) for local ranks 0, 1, 2, 3 returned {node0}, expected "
        "[0, 1, 2, 3]: R = node_rank x procs_per_node + local_rank")
    node1 = [ex.global_rank(1, g, 4) for g in range(4)]
    assert node1 == [4, 5, 6, 7], (
        f"global_rank(1, local_rank, 4) for local ranks 0, 1, 2, 3 returned {node1}, expected "
        "[4, 5, 6, 7]: R = node_rank x procs_per_node + local_rank")
    got = ex.global_rank(1, 1, 2)
    assert got == 3, (f"global_rank(node_rank=1, local_rank=1, procs_per_node=2) returned {got!r}, "
                      "expected 3 = 1 x 2 + 1")
    got = ex.global_rank(6, 2, 3)
    assert got == 20, (f"global_rank(node_rank=6, local_rank=2, procs_per_node=3) returned "
                       f"{got!r}, expected 20 = 6 x 3 + 2")


@pytest.mark.l1_global_rank
@pytest.mark.points(1)
def test_global_rank_every_rank_once(ex):
    """The shapes below, and three drawn at grading time (hidden.py)."""
    hidden = drawn("global_rank")
    shapes = [(hidden.randint(1, 9), hidden.randint(1, 9)) for _ in range(3)]
    for nodes, per_node in [(1, 1), (3, 3), (4, 2), (2, 5), *shapes]:
        ranks = [ex.global_rank(n, g, per_node) for n in range(nodes) for g in range(per_node)]
        assert ranks == list(range(nodes * per_node)), (
            f"global_rank(node_rank, local_rank, {per_node}) for every process of {nodes} node(s) "
            f"x {per_node}, node by node, returned {ranks}, expected "
            f"{list(range(nodes * per_node))}: each rank once, in order")


@pytest.mark.l1_global_rank
@pytest.mark.points(1)
def test_global_rank_rejects_impossible_ranks(ex):
    for args in [(0, 4, 4), (0, -1, 4), (-1, 0, 4), (0, 0, 0)]:
        with pytest.raises(ValueError):
            ex.global_rank(*args)


# --- l1_rank_layout -----------------------------------------------------------------------

@pytest.fixture
def own_global_rank(ex):
    """rank_layout graded on its own: while it runs, the submission's global_rank is the
    grader's (probes.lesson1_global_rank), so a mistake there costs l1_global_rank alone."""
    with ex.options(replace={"global_rank": "lesson1_global_rank"}):
        yield


ONE_GPU_EACH = [Process(r, r // 4, r % 4, (r % 4,)) for r in range(8)]
TWO_GPUS_EACH = [
    Process(0, 0, 0, (0, 1)), Process(1, 0, 1, (2, 3)),
    Process(2, 1, 0, (0, 1)), Process(3, 1, 1, (2, 3)),
]


def as_tuples(processes):
    return [(p.global_rank, p.node, p.local_rank, tuple(p.gpus)) for p in processes]


@pytest.mark.l1_rank_layout
@pytest.mark.usefixtures("own_global_rank")
@pytest.mark.points(2)
def test_layout_one_gpu_per_process(ex):
    got = as_tuples(ex.rank_layout(2, 4, 1))
    assert got == as_tuples(ONE_GPU_EACH), (
        f"rank_layout(nodes=2, gpus_per_node=4, gpus_per_process=1) gave (global_rank, node, "
        f"local_rank, gpus) {got}, expected {as_tuples(ONE_GPU_EACH)}")


@pytest.mark.l1_rank_layout
@pytest.mark.usefixtures("own_global_rank")
@pytest.mark.points(2)
def test_layout_two_gpus_per_process(ex):
    got = as_tuples(ex.rank_layout(2, 4, 2))
    assert got == as_tuples(TWO_GPUS_EACH), (
        f"rank_layout(nodes=2, gpus_per_node=4, gpus_per_process=2) gave (global_rank, node, "
        f"local_rank, gpus) {got}, expected {as_tuples(TWO_GPUS_EACH)}")


def layout(nodes, gpus_per_node, gpus_per_process):
    """The grader's own rank_layout, for the shapes drawn at grading time."""
    per_node = gpus_per_node // gpus_per_process
    return [(node * per_node + local, node, local,
             tuple(range(local * gpus_per_process, (local + 1) * gpus_per_process)))
            for node in range(nodes) for local in range(per_node)]


@pytest.mark.l1_rank_layout
@pytest.mark.usefixtures("own_global_rank")
@pytest.mark.points(1)
def test_layout_odd_shapes(ex):
    """The shapes below, and three drawn at grading time (hidden.py)."""
    hidden = drawn("rank_layout")
    for _ in range(3):
        gpus_per_process = hidden.randint(1, 4)
        shape = (hidden.randint(1, 5), gpus_per_process * hidden.randint(1, 4),
                 gpus_per_process)
        got = as_tuples(ex.rank_layout(*shape))
        assert got == layout(*shape), (
            f"rank_layout{shape} gave (global_rank, node, local_rank, gpus) {got}, expected "
            f"{layout(*shape)}")
    layout_3_6_3 = ex.rank_layout(3, 6, 3)  # 3 nodes x 2 processes of 3 GPUs
    want = [
        (0, 0, 0, (0, 1, 2)), (1, 0, 1, (3, 4, 5)),
        (2, 1, 0, (0, 1, 2)), (3, 1, 1, (3, 4, 5)),
        (4, 2, 0, (0, 1, 2)), (5, 2, 1, (3, 4, 5)),
    ]
    got = as_tuples(layout_3_6_3)
    assert got == want, (f"rank_layout(nodes=3, gpus_per_node=6, gpus_per_process=3) gave "
                         f"(global_rank, node, local_rank, gpus) {got}, expected {want}")
    got = as_tuples(ex.rank_layout(1, 1))
    assert got == [(0, 0, 0, (0,))], (
        f"rank_layout(nodes=1, gpus_per_node=1) gave (global_rank, node, local_rank, gpus) "
        f"{got}, expected [(0, 0, 0, (0,))]: one process on GPU 0")
    spanning = ex.rank_layout(5, 8, 8)  # one process spanning a whole node
    assert len(spanning) == 5, (
        f"rank_layout(nodes=5, gpus_per_node=8, gpus_per_process=8) gave {len(spanning)} "
        "processes, expected 5: one per node, each owning all 8 GPUs")


@pytest.mark.l1_rank_layout
@pytest.mark.usefixtures("own_global_rank")
@pytest.mark.points(1)
def test_layout_rejects_bad_shapes(ex):
    for shape in [(2, 4, 3), (2, 3, 2), (0, 4, 1), (2, 0, 1), (2, 4, 0), (2, -4, 1), (2, 4, 5)]:
        with pytest.raises(ValueError):
            ex.rank_layout(*shape)


# --- l1_node_groups -----------------------------------------------------------------------

@pytest.mark.l1_node_groups
@pytest.mark.points(2)
def test_node_groups(ex):
    got = ex.node_groups(2, 2)
    assert got == [[0, 1], [2, 3]], (f"node_groups(nodes=2, procs_per_node=2) returned {got}, "
                                     "expected [[0, 1], [2, 3]]: one list per node, its ranks")
    got = ex.node_groups(2, 4)
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]], (
        f"node_groups(nodes=2, procs_per_node=4) returned {got}, expected "
        "[[0, 1, 2, 3], [4, 5, 6, 7]]: one list per node, its ranks")
    got = ex.node_groups(3, 1)
    assert got == [[0], [1], [2]], (f"node_groups(nodes=3, procs_per_node=1) returned {got}, "
                                    "expected [[0], [1], [2]]: one list per node, its ranks")
    got = ex.node_groups(1, 3)
    assert got == [[0, 1, 2]], (f"node_groups(nodes=1, procs_per_node=3) returned {got}, "
                                "expected [[0, 1, 2]]: one node holding every rank")
    hidden = drawn("node_groups")  # and three shapes drawn at grading time (hidden.py)
    for nodes, per_node in [(hidden.randint(1, 7), hidden.randint(1, 7)) for _ in range(3)]:
        want = [list(range(n * per_node, (n + 1) * per_node)) for n in range(nodes)]
        got = ex.node_groups(nodes, per_node)
        assert got == want, (f"node_groups(nodes={nodes}, procs_per_node={per_node}) returned "
                             f"{got}, expected {want}: one list per node, its ranks")


@pytest.mark.l1_node_groups
@pytest.mark.points(1)
def test_node_groups_reject_bad_counts(ex):
    for args in [(0, 2), (2, 0), (-1, 3)]:
        with pytest.raises(ValueError):
            ex.node_groups(*args)


# --- l1_identity ----------------------------------------------------------------------------

TORCHRUN_ENV = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                "GROUP_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.l1_identity
@pytest.mark.points(1)
def test_identity_from_torchrun_env(ex):
    got = ex.identity_from_env(TORCHRUN_ENV)
    want = {"rank": 5, "local_rank": 1, "world_size": 8, "local_world_size": 4, "node_rank": 1}
    assert got == want, (f"identity_from_env(torchrun's variables {TORCHRUN_ENV}) returned "
                         f"{got}, expected {want}")


@pytest.mark.l1_identity
@pytest.mark.points(1)
def test_identity_node_rank_fallbacks(ex):
    env = dict(TORCHRUN_ENV)
    del env["GROUP_RANK"]
    env["NODE_RANK"] = "1"
    got = ex.identity_from_env(env)["node_rank"]
    assert got == 1, (f"without GROUP_RANK but with NODE_RANK=1, identity_from_env gave "
                      f"node_rank {got!r}, expected 1 (read NODE_RANK)")
    del env["NODE_RANK"]
    got = ex.identity_from_env(env)["node_rank"]
    assert got == 1, (f"without GROUP_RANK and NODE_RANK (RANK=5, LOCAL_WORLD_SIZE=4), "
                      f"identity_from_env gave node_rank {got!r}, expected 1 = 5 // 4")
    one_node = {"RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "3"}
    got = ex.identity_from_env(one_node)
    want = {"rank": 2, "local_rank": 2, "world_size": 3, "local_world_size": 3, "node_rank": 0}
    assert got == want, (f"identity_from_env({one_node}) returned {got}, expected {want}: "
                         "without LOCAL_WORLD_SIZE the job is one node of WORLD_SIZE processes")


@pytest.mark.l1_identity
@pytest.mark.points(1)
def test_identity_without_launcher_is_a_clear_error(ex):
    with pytest.raises(RuntimeError) as error:
        ex.identity_from_env({"HOME": "/home/student"})
    message = str(error.value)
    assert "torchrun" in message, ("identity_from_env without the launcher's variables raised "
                                   f"RuntimeError({message!r}): it should mention torchrun")
    assert "RANK" in message, ("identity_from_env without the launcher's variables raised "
                               f"RuntimeError({message!r}): it should name the missing RANK")
    with pytest.raises(RuntimeError, match="WORLD_SIZE"):
        ex.identity_from_env({"RANK": "0", "LOCAL_RANK": "0"})


NODES, PER_NODE = 2, 2  # the job: two simulated nodes of two processes


def judge_identity(seen):
    problems = []
    for rank, me in enumerate(seen):
        truth = {"rank": rank, "local_rank": rank % PER_NODE, "world_size": NODES * PER_NODE,
                 "local_world_size": PER_NODE, "node_rank": rank // PER_NODE}
        if me != truth:
            problems.append(f"identity_from_env gave {me}, the job says {truth}")
    return problems, ""


def judge_node_groups(seen):
    problems = []
    for rank, observed in enumerate(seen):
        groups = observed["groups"]
        mine = [g for g in groups if isinstance(g, list) and rank in g] \
            if isinstance(groups, list) else []
        if len(mine) != 1:
            problems.append(f"rank {rank} is in {len(mine)} node groups, expected exactly 1")
            continue
        same_node = [r for r in range(NODES * PER_NODE) if r // PER_NODE == rank // PER_NODE]
        if observed["total"] != float(sum(same_node)):
            problems.append(f"all_reduce in rank {rank}'s node group gave {observed['total']}, "
                            f"expected the sum of ranks {same_node} (the processes of node "
                            f"{rank // PER_NODE})")
    return problems, ""


def job_verdict(name):
    """The line about `name` from a simulated 2-node x 2-process job, launched once for the
    tests that need it, judged here from what each process saw."""
    assert os.environ.get("RANK") is None, (  # the test process itself is no rank
        f"the grader's own process has RANK={os.environ.get('RANK')} set: grade outside torchrun")
    report = judged(JOBS[4], {"identity": ("identity", judge_identity),
                              "node_groups": ("node_groups", judge_node_groups)})
    return verdict(report, name)


@pytest.mark.l1_identity
@pytest.mark.points(3)
def test_identity_under_torchrun_two_nodes(ex):
    ex.identity_from_env(TORCHRUN_ENV)  # fail fast, before paying for a launch
    line = job_verdict("identity")
    assert line == "identity: ok on 4 ranks", (
        f"identity_from_env in a torchrun job of 2 nodes x 2 processes: {line}")


@pytest.mark.l1_node_groups
@pytest.mark.points(1)
def test_node_groups_under_torchrun_two_nodes(ex):
    """The groups made from node_groups() sum exactly the ranks of each node."""
    ex.node_groups(2, 2)
    line = job_verdict("node_groups")
    assert line == "node_groups: ok on 4 ranks", (
        f"node_groups(2, 2) in a torchrun job of 2 nodes x 2 processes: {line}")
