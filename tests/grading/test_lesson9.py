"""Grading tests for lesson 9. identity_from_launcher is called here with each launcher's
variables (from lesson 9's launchers table), nested launchers and impossible sets;
shard_loader's loader is read epoch by epoch in the submission's process and compared here
with DistributedSampler's shares; exact_accuracy runs at 2 and 3 ranks as relayed jobs, one
per check (workers/lesson9_validation.py: every rank a sandbox of its own, the relay in this
process the only road between them), over shares a DistributedSampler padded, uneven shares
and sub-groups, every collective it starts in the relay's record."""

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from ddpcourse.course.hidden import drawn
from ddpcourse.course.jobs import (
    brief,
    difference,
    graded,
    judge_once,
    one_line_value_error,
    relayed_report,
    verdict,
)
from ddpcourse.course.probes import (
    class_names,
    lesson9_case,
    lesson9_groups,
    lesson9_loader,
    lesson9_truth,
)

JOBS = {}  # no torchrun job: every check is a relayed job of its own (report below)


@pytest.fixture(scope="module")
def ex():
    yield from graded(9)


# --- l9_launcher_identity ------------------------------------------------------------------

def who(rank, local, node, world):
    return {"rank": rank, "local_rank": local, "node_rank": node, "world_size": world}


MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "HOME": "/home/student"}
TORCHRUN = {**MASTER, "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8",
            "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}
LIGHTNING = {**MASTER, "LOCAL_RANK": "1", "NODE_RANK": "2", "WORLD_SIZE": "9"}
DEEPSPEED = {**MASTER, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_SIZE": "2",
             "CROSS_RANK": "1", "CROSS_SIZE": "2", "CUDA_VISIBLE_DEVICES": "0,1"}
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "12", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
SRUN = {"SLURM_PROCID": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS": "6", "SLURM_NODEID": "2",
        "SLURM_JOB_ID": "77"}


def launched(environ, *args, **kwargs):
    """identity_from_launcher's call as a message shows it."""
    shown = ", ".join(f"{k}={v}" for k, v in environ.items())
    more = "".join(f", {a!r}" for a in args) + "".join(f", {k}={v!r}" for k, v in kwargs.items())
    return f"identity_from_launcher({{{shown}}}{more})"


def wrong_identity(case, got, want, environ, *args, **kwargs):
    """The message of an identity answered wrong: the case, the call, what came back."""
    return f"{case}: {launched(environ, *args, **kwargs)} returned {got}, expected {want}"


@pytest.mark.l9_launcher_identity
@pytest.mark.points(1)
def test_identity_under_torchrun_and_accelerate_launch(ex):
    got, want = ex.identity_from_launcher(TORCHRUN), who(5, 1, 1, 8)
    assert got == want, wrong_identity("torchrun, 2 nodes of 4", got, want, TORCHRUN)
    one_node = {"RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
                "GROUP_RANK": "0"}
    got, want = ex.identity_from_launcher(one_node), who(2, 2, 0, 3)
    assert got == want, wrong_identity("torchrun, one node", got, want, one_node)
    no_group_rank = {k: v for k, v in TORCHRUN.items() if k != "GROUP_RANK"}
    got, want = ex.identity_from_launcher(no_group_rank), who(5, 1, 1, 8)
    assert got == want, wrong_identity("torchrun without GROUP_RANK (node = RANK // "
                                       "LOCAL_WORLD_SIZE)", got, want, no_group_rank)


@pytest.mark.l9_launcher_identity
@pytest.mark.points(2)
def test_identity_of_lightning_s_children_without_rank(ex):
    # The Trainer started by python: 3 devices per node, node 2, local rank 1: rank 7 of 9.
    child = "Lightning's child, no RANK (rank = NODE_RANK x devices_per_node + LOCAL_RANK)"
    got, want = ex.identity_from_launcher(LIGHTNING, devices_per_node=3), who(7, 1, 2, 9)
    assert got == want, wrong_identity(child, got, want, LIGHTNING, devices_per_node=3)
    on_node_0 = {**MASTER, "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    got, want = ex.identity_from_launcher(on_node_0, devices_per_node=2), who(1, 1, 0, 2)
    assert got == want, wrong_identity(f"{child}, no NODE_RANK (node 0)", got, want, on_node_0,
                                       devices_per_node=2)
    two_nodes = {**MASTER, "LOCAL_RANK": "0", "NODE_RANK": "1", "WORLD_SIZE": "4"}
    got, want = ex.identity_from_launcher(two_nodes, devices_per_node=2), who(2, 0, 1, 4)
    assert got == want, wrong_identity(child, got, want, two_nodes, devices_per_node=2)
    # Nodes unequal to devices per node: 2 nodes of 3, 4 nodes of 2.
    two_of_three = {**MASTER, "LOCAL_RANK": "2", "NODE_RANK": "1", "WORLD_SIZE": "6"}
    got, want = ex.identity_from_launcher(two_of_three, devices_per_node=3), who(5, 2, 1, 6)
    assert got == want, wrong_identity(f"{child}, 2 nodes of 3", got, want, two_of_three,
                                       devices_per_node=3)
    four_of_two = {**MASTER, "LOCAL_RANK": "1", "NODE_RANK": "3", "WORLD_SIZE": "8"}
    got, want = ex.identity_from_launcher(four_of_two, devices_per_node=2), who(7, 1, 3, 8)
    assert got == want, wrong_identity(f"{child}, 4 nodes of 2", got, want, four_of_two,
                                       devices_per_node=2)
    one_line_value_error(ex.identity_from_launcher, LIGHTNING)  # the devices are needed


@pytest.mark.l9_launcher_identity
@pytest.mark.points(1)
def test_identity_under_deepspeed_with_its_local_rank_argument(ex):
    argv = ["--local_rank=1", "--zero-stage", "2"]
    got, want = ex.identity_from_launcher(DEEPSPEED, argv), who(3, 1, 1, 4)
    assert got == want, wrong_identity("deepspeed, --local_rank=1 among the arguments", got, want,
                                       DEEPSPEED, argv)
    argv = ["--epochs", "1", "--local_rank", "1"]
    got, want = ex.identity_from_launcher(DEEPSPEED, argv), who(3, 1, 1, 4)
    assert got == want, wrong_identity("deepspeed, --local_rank 1 among the arguments", got, want,
                                       DEEPSPEED, argv)
    three_nodes_of_two = {**DEEPSPEED, "RANK": "5", "WORLD_SIZE": "6", "CROSS_RANK": "2",
                          "CROSS_SIZE": "3"}
    got, want = ex.identity_from_launcher(three_nodes_of_two, ["--local_rank=1"]), who(5, 1, 2, 6)
    assert got == want, wrong_identity("deepspeed, 3 nodes of 2 (node = CROSS_RANK)", got, want,
                                       three_nodes_of_two, ["--local_rank=1"])
    one_line_value_error(ex.identity_from_launcher, DEEPSPEED, ["--local_rank=0"])
    one_line_value_error(ex.identity_from_launcher, DEEPSPEED, ["--local_rank", "2"])


@pytest.mark.l9_launcher_identity
@pytest.mark.points(1)
def test_identity_under_mpirun_and_srun(ex):
    got, want = ex.identity_from_launcher(OPEN_MPI), who(7, 3, 1, 12)
    assert got == want, wrong_identity("mpirun (Open MPI), node = rank // local size", got, want,
                                       OPEN_MPI)
    got, want = ex.identity_from_launcher(SRUN), who(4, 1, 2, 6)
    assert got == want, wrong_identity("srun", got, want, SRUN)
    hidden = drawn("launcher_identity")  # and both at layouts drawn at grading time
    for _ in range(3):
        nodes, per_node = hidden.randint(1, 6), hidden.randint(1, 8)
        node, local = hidden.randrange(nodes), hidden.randrange(per_node)
        rank, world = node * per_node + local, nodes * per_node
        want = who(rank, local, node, world)
        for name, environ in [
                ("mpirun (Open MPI)", {"OMPI_COMM_WORLD_RANK": rank,
                                       "OMPI_COMM_WORLD_LOCAL_RANK": local,
                                       "OMPI_COMM_WORLD_SIZE": world,
                                       "OMPI_COMM_WORLD_LOCAL_SIZE": per_node}),
                ("srun", {"SLURM_PROCID": rank, "SLURM_LOCALID": local, "SLURM_NTASKS": world,
                          "SLURM_NODEID": node, "SLURM_JOB_ID": "77"})]:
            environ = {k: str(v) for k, v in environ.items()}
            got = ex.identity_from_launcher(environ)
            assert got == want, wrong_identity(f"{name}, {nodes} node(s) of {per_node}", got,
                                               want, environ)


@pytest.mark.l9_launcher_identity
@pytest.mark.points(2)
def test_identity_of_nested_launchers_is_the_innermost(ex):
    # torchrun started by srun, one task per node: SLURM_PROCID is the node's task, not the rank
    under_srun = {**TORCHRUN, "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2",
                  "SLURM_NODEID": "1"}
    got, want = ex.identity_from_launcher(under_srun), who(5, 1, 1, 8)
    assert got == want, wrong_identity("torchrun started by srun: torchrun's variables win",
                                       got, want, under_srun)
    # the Trainer started by python in an interactive SLURM shell (srun --pty bash), where
    # Lightning's own launcher runs
    lightning_in_slurm = {**LIGHTNING, "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                          "SLURM_NTASKS": "1", "SLURM_NODEID": "0"}
    got = ex.identity_from_launcher(lightning_in_slurm, devices_per_node=3)
    want = who(7, 1, 2, 9)
    assert got == want, wrong_identity("Lightning's child in a SLURM shell: Lightning's "
                                       "variables win", got, want, lightning_in_slurm,
                                       devices_per_node=3)
    # mpirun inside an allocation
    got, want = ex.identity_from_launcher({**SRUN, **OPEN_MPI}), who(7, 3, 1, 12)
    assert got == want, wrong_identity("mpirun inside a SLURM allocation: mpirun's variables "
                                       "win", got, want, {**SRUN, **OPEN_MPI})
    # torchrun started by mpirun, one per node: the workers inherit mpirun's variables too
    under_mpirun = {**TORCHRUN, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                    "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    got, want = ex.identity_from_launcher(under_mpirun), who(5, 1, 1, 8)
    assert got == want, wrong_identity("torchrun started by mpirun: torchrun's variables win",
                                       got, want, under_mpirun)


@pytest.mark.l9_launcher_identity
@pytest.mark.points(2)
def test_identity_refuses_an_impossible_set(ex):
    got, want = ex.identity_from_launcher(TORCHRUN), who(5, 1, 1, 8)  # not a refusal of all
    assert got == want, wrong_identity("torchrun, a possible set (not every set is refused)",
                                       got, want, TORCHRUN)
    impossible = [
        ({**TORCHRUN, "RANK": "8"}, (), None),                     # rank outside the world
        ({**TORCHRUN, "RANK": "6"}, (), None),                     # not node x 4 + local
        ({**TORCHRUN, "LOCAL_RANK": "4", "RANK": "8",
          "WORLD_SIZE": "12"}, (), None),                          # local rank outside its node
        ({**TORCHRUN, "WORLD_SIZE": "7", "RANK": "5"}, (), None),  # not a whole number of nodes
        ({**TORCHRUN, "RANK": "five"}, (), None),                  # not a number
        ({**LIGHTNING, "LOCAL_RANK": "3"}, (), 3),                 # a fourth device of three
        ({**LIGHTNING, "WORLD_SIZE": "8"}, (), 3),                 # nodes of 3 make no 8
        ({**OPEN_MPI, "OMPI_COMM_WORLD_RANK": "6"}, (), None),     # rank 6 is node 1's local 2
        ({**SRUN, "SLURM_PROCID": "6"}, (), None),                 # outside the tasks
        (MASTER, (), None),                                        # no launcher at all
        ({"LOCAL_RANK": "0"}, (), 1),                              # no world size
    ]
    for environ, argv, devices in impossible:
        one_line_value_error(ex.identity_from_launcher, environ, argv, devices)


# --- l9_shard_loader -----------------------------------------------------------------------

def spec(length, batch_size, shuffle, drop_last=False, **more):
    return {"length": length, "batch_size": batch_size, "shuffle": shuffle,
            "drop_last": drop_last, **more}


def sampler_batches(length, batch_size, rank, world, shuffle, seed, epoch, drop_last=False):
    """The batches lesson 3's loader gives `rank` in `epoch`: DistributedSampler's share."""
    sampler = DistributedSampler(range(length), num_replicas=world, rank=rank,
                                 shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    share = list(sampler)
    batches = [share[i:i + batch_size] for i in range(0, len(share), batch_size)]
    return [b for b in batches if len(b) == batch_size] if drop_last else batches


def loader(loader_spec):
    """A loader spec in words, for a message."""
    s = loader_spec
    words = [f"{'a shuffling' if s['shuffle'] else 'an ordered'} loader of {s['length']} samples, "
             f"batch_size={s['batch_size']}, drop_last={s['drop_last']}"]
    if s.get("sharded"):
        words.append(f"already sharded for rank {s['sharded'][0]} of {s['sharded'][1]}")
    if s.get("sampler"):
        words.append(f"a {s['sampler']} sampler")
    if s.get("batch_sampler"):
        words.append("a batch_sampler")
    if s.get("collate"):
        words.append(f"a collate_fn making {s['collate']} (i, -i)")
    if s.get("num_workers"):
        words.append(f"num_workers={s['num_workers']}")
    return ", ".join(words)


def read_difference(read, want, ranks=None):
    """The first rank and epoch whose batches differ from DistributedSampler's, and where.
    ranks: the ranks that read[0], read[1], ... are (0, 1, ... if not given)."""
    try:
        for rank, mine, theirs in zip(ranks or range(len(read)), read, want, strict=True):
            for epoch, (got, expected) in enumerate(zip(mine, theirs, strict=False)):
                if got != expected:
                    return (f"rank {rank}, epoch {epoch}: "
                            f"{difference(got, expected, 'batch', 'batches')}")
            if mine != theirs:
                return f"rank {rank} read {len(mine)} epochs, expected {len(theirs)}"
    except Exception:  # not lists of epochs of batches: show them as they are
        pass
    return f"read {brief(read)}, expected {brief(want)}"


def read_every_rank(ex, loader_spec, world, seed=0, epochs=2):
    return [ex.probe("sharded_epochs", loader_spec, rank, world, seed=seed, epochs=epochs)
            for rank in range(world)]


def expected_every_rank(loader_spec, world, seed=0, epochs=2):
    return [[sampler_batches(loader_spec["length"], loader_spec["batch_size"], rank, world,
                             loader_spec["shuffle"], seed, epoch, loader_spec["drop_last"])
             for epoch in range(epochs)] for rank in range(world)]


@pytest.mark.l9_shard_loader
@pytest.mark.points(2)
def test_shard_a_shuffling_loader_as_distributed_sampler_would(ex):
    for length, batch, world, seed, drop_last in [
            (23, 4, 3, 5, False), (40, 8, 2, 0, False), (17, 3, 4, 11, False),
            (23, 4, 3, 7, True)]:  # the sampler pads to 24: 8 each, two whole batches
        loader_spec = spec(length, batch, shuffle=True, drop_last=drop_last)
        read = read_every_rank(ex, loader_spec, world, seed=seed)
        assert all(class_names(DataLoader)[0] in r["loader_classes"] and r["set_epoch"]
                   for r in read), (
            f"shard_loader({loader(loader_spec)}, rank, world_size={world}, seed={seed}) must "
            "return a DataLoader whose sampler has set_epoch; (class, set_epoch) per rank: "
            f"{brief([(r['loader_classes'][:1], r['set_epoch']) for r in read], 200)}")
        got = [r["read"] for r in read]
        want = expected_every_rank(loader_spec, world, seed)
        assert got == want, (
            f"shard_loader({loader(loader_spec)}, rank, world_size={world}, seed={seed}), read "
            f"with set_epoch(epoch), is not DistributedSampler's share at "
            f"{read_difference(got, want)}")
    # set_epoch reaches the order: each epoch its own
    epochs = read[0]["read"]
    assert epochs[0] != epochs[1], (
        f"shard_loader({loader(loader_spec)}, rank=0, world_size={world}, seed={seed}) read "
        f"the same batches in epochs 0 and 1 ({brief(epochs[0], 80)}): set_epoch(epoch) must "
        "reach the order")


@pytest.mark.l9_shard_loader
@pytest.mark.points(1)
def test_shard_an_ordered_loader_in_order(ex):
    for length, batch, world, drop_last in [(9, 2, 2, False), (10, 3, 3, True), (7, 7, 3, False),
                                            (11, 3, 2, True)]:  # 6 each after padding: 2 batches
        loader_spec = spec(length, batch, shuffle=False, drop_last=drop_last)
        read = read_every_rank(ex, loader_spec, world)
        got, want = [r["read"] for r in read], expected_every_rank(loader_spec, world)
        assert got == want, (
            f"shard_loader({loader(loader_spec)}, rank, world_size={world}) is not "
            f"DistributedSampler's share (shuffle=False) at {read_difference(got, want)}")


@pytest.mark.l9_shard_loader
@pytest.mark.points(1)
def test_shard_keeps_the_batch_collate_and_workers(ex):
    loader_spec = spec(21, 5, shuffle=True, drop_last=True, collate="pairs")
    read = read_every_rank(ex, loader_spec, 2, seed=3, epochs=1)
    for rank, r in enumerate(read):
        want = sampler_batches(21, 5, rank, 2, True, 3, 0, drop_last=True)
        assert r["read"] == [[[[i, -i] for i in batch] for batch in want]], (
            f"shard_loader({loader(loader_spec)}, rank={rank}, world_size=2, seed=3) must keep "
            f"the batch size, collate_fn and drop_last: "
            f"{read_difference([r['read']], [[[[[i, -i] for i in b] for b in want]]], [rank])}")
    kept = ex.probe("sharded_epochs", spec(12, 4, shuffle=False, num_workers=2), 0, 2, epochs=0)
    assert kept["num_workers"] == 2, (
        f"shard_loader({loader(spec(12, 4, shuffle=False, num_workers=2))}, rank=0, "
        f"world_size=2) returned a loader of num_workers={kept['num_workers']!r}, expected 2")


@pytest.mark.l9_shard_loader
@pytest.mark.points(2)
def test_an_already_sharded_loader_is_not_sharded_again(ex):
    for length, world, shuffle in [(30, 3, True), (11, 2, False)]:
        for rank in range(world):
            loader_spec = spec(length, 2, shuffle=shuffle, sharded=(rank, world), seed=4)
            read = ex.probe("sharded_epochs", loader_spec, rank, world, seed=4)
            want = [sampler_batches(length, 2, rank, world, shuffle, 4, e) for e in range(2)]
            assert read["read"] == want, (
                f"shard_loader({loader(loader_spec)}, rank={rank}, world_size={world}, seed=4) "
                f"must keep the loader's own share, not shard it again: "
                f"{read_difference([read['read']], [want], [rank])}")


@pytest.mark.l9_shard_loader
@pytest.mark.points(1)
def test_shard_for_one_rank_and_for_more_ranks_than_samples(ex):
    alone = spec(6, 4, shuffle=True)
    got = [r["read"] for r in read_every_rank(ex, alone, 1, seed=2)]
    want = expected_every_rank(alone, 1, seed=2)  # DistributedSampler's order, not the loader's
    assert got == want, (
        f"shard_loader({loader(alone)}, rank=0, world_size=1, seed=2) is not DistributedSampler's "
        f"one share (its order, not the loader's) at {read_difference(got, want)}")
    crowded = spec(2, 1, shuffle=False)
    got = [r["read"] for r in read_every_rank(ex, crowded, 5)]
    want = expected_every_rank(crowded, 5)
    assert got == want, (
        f"shard_loader({loader(crowded)}, rank, world_size=5): 5 ranks, 2 samples, padded to "
        f"one each; not DistributedSampler's share at {read_difference(got, want)}")


@pytest.mark.l9_shard_loader
@pytest.mark.points(2)
def test_shard_refuses_what_it_cannot_split(ex):
    right = spec(10, 2, True)  # not a refusal of all
    got, want = [r["read"] for r in read_every_rank(ex, right, 2)], expected_every_rank(right, 2)
    assert got == want, (f"shard_loader({loader(right)}, rank, world_size=2), one it can split, "
                         f"is not DistributedSampler's share at {read_difference(got, want)}")
    refused = [(spec(10, 2, True, sharded=(1, 2)), 0, 2),    # sharded for another rank
               (spec(10, 2, True, sharded=(0, 2)), 0, 3),    # for another world size
               (spec(10, 2, True, sampler="weighted"), 0, 2),
               (spec(10, 2, False, batch_sampler=True), 0, 2),
               (spec(10, 2, True), 2, 2), (spec(10, 2, True), -1, 2)]
    for loader_spec, rank, world in refused:
        with pytest.raises(ValueError) as error:
            ex.probe("sharded_epochs", loader_spec, rank, world, epochs=1)
        assert "\n" not in str(error.value).strip(), (
            f"shard_loader({loader(loader_spec)}, rank={rank}, world_size={world}) raised a "
            f"ValueError of several lines, expected one: {brief(str(error.value), 300)}")
    weighted = lesson9_loader(spec(10, 2, True, sampler="weighted"))  # a loader
    assert weighted.batch_size == 2, (
        f"the grader's weighted loader has batch_size {weighted.batch_size}, expected 2")


# --- l9_exact_validation -------------------------------------------------------------------

def exact(case, world):
    length, _ = lesson9_case(case, world)
    return lesson9_truth(case, length).double().mean().item()


def value_problems(mine, want, where):
    if mine["raised"]:
        return [f"{where}: raised {mine['raised']}"]
    value = mine["value"]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()  # not the float asked for: that costs the world-of-one point only
    if type(value) is not float:
        return [f"{where}: returned {type(value).__name__}, not a number"]
    if not abs(value - want) <= 1e-6:
        return [f"{where}: {value:.6f}, one process gets {want:.6f}"]
    return []


def judge_value(case):
    def judge(seen):
        world = len(seen)
        problems = [p for rank, mine in enumerate(seen)
                    for p in value_problems(mine, exact(case, world), f"rank {rank}")]
        if not problems and len({float(mine["value"]) for mine in seen}) != 1:
            problems.append("the ranks returned different values")
        return problems, ""
    return judge_once(judge)


def judge_groups(seen):
    world, problems = len(seen), []
    groups = lesson9_groups(world)
    for rank, mine in enumerate(seen):
        i = next(i for i, ranks in enumerate(groups) if rank in ranks)
        problems += value_problems(mine, exact(f"group{i}", len(groups[i])),
                                   f"rank {rank} (group {groups[i]})")
        strays = [op for op, _, _, ranks, _ in mine["collectives"]
                  if set(ranks) != set(groups[i])]
        if strays:
            problems.append(f"rank {rank}: {strays[0]} over another group than its own "
                            f"{groups[i]}")
    return problems, ""


def judge_refused(before_any_collective):
    def judge(seen):
        problems = [p for rank, mine in enumerate(seen) for p in value_problems(
            mine["first"], exact("padded", len(seen)), f"rank {rank}, before (padded)")]
        for rank, observed in enumerate(seen):
            then = observed["then"]  # the case that must be refused, after the right answer
            if not then["raised"]:
                problems.append(f"rank {rank}: returned {then['value']!r}, expected ValueError")
            elif before_any_collective and (then["collectives"] or then["messages"]):
                problems.append(f"rank {rank}: {len(then['collectives'])} collectives before "
                                "the ValueError; check the input first")
        return problems, ""
    return judge


def report(world_size, name):
    """The report of check `name` as a relayed job at `world_size` ranks, judged here."""
    verdicts = {"padded": ("padded", judge_value("padded")),
                "uneven": ("uneven", judge_value("uneven")),
                "groups": ("groups", judge_groups),
                "missing": ("missing", judge_refused(False)),
                "bad": ("bad", judge_refused(True))}
    return relayed_report("lesson9_validation.py", verdicts, name, world_size)


def assert_ok(world_size, name):
    line = verdict(report(world_size, name), name)
    assert line == f"{name}: ok on {world_size} ranks", (
        f"exact_accuracy in a job of {world_size} processes: {line}")


@pytest.mark.l9_exact_validation
@pytest.mark.points(1)
def test_exact_accuracy_in_a_world_of_one(ex):
    """Also the one check that the answer is a Python float, as asked, not a tensor."""
    with ex.world_of_one():
        for case in ("uneven", "padded"):
            value, raised = ex.probe("exact_accuracy_alone", case)
            assert raised is None, (f"exact_accuracy on the {case!r} shares in a world of one "
                                    f"process raised {raised}")
            assert type(value) is float and abs(value - exact(case, 1)) <= 1e-6, (
                f"exact_accuracy on the {case!r} shares in a world of one process returned "
                f"{brief(value, 80)} ({type(value).__name__}), expected the float "
                f"{exact(case, 1):.6f}")


@pytest.mark.l9_exact_validation
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_exact_accuracy_counts_the_sampler_s_padding_once(ex, world_size):
    assert_ok(world_size, "padded")


@pytest.mark.l9_exact_validation
@pytest.mark.points(2)
def test_exact_accuracy_over_uneven_shares(ex):
    assert_ok(3, "uneven")


@pytest.mark.l9_exact_validation
@pytest.mark.points(2)
def test_exact_accuracy_in_sub_groups_with_their_collectives_only(ex):
    assert_ok(3, "groups")


@pytest.mark.l9_exact_validation
@pytest.mark.points(1)
def test_exact_accuracy_refuses_a_sample_no_rank_evaluated_on_every_rank(ex):
    assert_ok(3, "missing")


@pytest.mark.l9_exact_validation
@pytest.mark.points(1)
def test_exact_accuracy_refuses_bad_input_before_any_collective(ex):
    assert_ok(2, "bad")
