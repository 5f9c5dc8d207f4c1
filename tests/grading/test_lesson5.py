"""Grading tests for lesson 5. The node lists below are SLURM's own: every one SLURM reads
expands as `scontrol show hostnames` expands it, and SLURM refuses the lists with text after
their last bracket, the one form the course adds (tests/project/test_lesson5_exercises.py checks
both wherever SLURM is installed). The devices are checked in a real two-node job as well."""

import re

import pytest

from ddpcourse.course.hidden import drawn
from ddpcourse.course.jobs import TORCHRUN_JOBS, graded, judged, verdict

# world size -> its job: two simulated nodes of two processes
JOBS = TORCHRUN_JOBS[5]


@pytest.fixture(scope="module")
def ex():
    yield from graded(5)


@pytest.fixture
def no_scontrol(ex):
    """expand_nodelist must do the expanding, not ask SLURM's `scontrol show hostnames`."""
    why = "expand_nodelist asked another program (scontrol?): expand the list yourself"
    with ex.options(refuse=[("subprocess", "Popen", why), ("os", "system", why)]):
        yield


def outcome(call):
    """What a graded call gave, or the error it raised, as one short text for a report."""
    try:
        return call()
    except Exception as error:
        return f"raised {type(error).__name__}: {' '.join(str(error).split())[:150]}"


def said(got):
    """What a call gave, for a message: its value, or the error `outcome` wrote out."""
    return got if isinstance(got, str) and got.startswith("raised ") else f"returned {got!r}"


def assert_all_right(cases, call, shown_as=repr):
    """cases: {argument: wanted}; one failure message naming every argument answered wrong.
    shown_as(argument): the call with that argument, as the message names it."""
    wrong = [f"{shown_as(arg)} {said(got)}, expected {want!r}"
             for arg, want in cases.items() if (got := outcome(lambda arg=arg: call(arg))) != want]
    assert not wrong, f"{len(wrong)} of {len(cases)} answered wrong:\n" + "\n".join(wrong)


def assert_all_refused(error, cases, call, shown_as=repr):
    """Every argument in cases must make call raise `error`."""
    wrong = []
    for arg in cases:
        try:
            got = call(arg)
        except error:
            continue
        except Exception as other:
            got = f"{type(other).__name__}: {other}"
        wrong.append(f"{shown_as(arg)} gave {got!r}, expected a {error.__name__}")
    assert not wrong, f"{len(wrong)} of {len(cases)} not refused:\n" + "\n".join(wrong)


def expanded(nodelist):
    return f"expand_nodelist({nodelist!r})"


# --- l5_expand_nodelist ------------------------------------------------------------------
# Node list -> the hosts it names, grouped by what each group shows.

AS_JOBS_GET_THEM = {  # one list of each shape: every expansion mistake fails here too
    "gpu[8-10]": ["gpu8", "gpu9", "gpu10"],
    "node[01-03,07],gpu5": ["node01", "node02", "node03", "node07", "gpu5"],
    "cpu[098-101],n[08-9]": ["cpu098", "cpu099", "cpu100", "cpu101", "n08", "n09"],
    "rack[1-2]-n[1-2]": ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"],
    "gpu[1-2]-ib": ["gpu1-ib", "gpu2-ib"],
    "z[3,1],a1": ["z3", "z1", "a1"],
}
PLAIN_AND_WHITE_SPACE = {
    "gpu5": ["gpu5"],
    "node[1-3]": ["node1", "node2", "node3"],
    "n[7]": ["n7"],
    "a,b , c": ["a", "b", "c"],
    " gpu[1-2] ,\tcpu1 ": ["gpu1", "gpu2", "cpu1"],
}
WIDTHS = {  # every number of a range as wide as the range's first bound
    "c[08-11]": ["c08", "c09", "c10", "c11"],
    "gpu[8-10]": ["gpu8", "gpu9", "gpu10"],
    "n[99-101]": ["n99", "n100", "n101"],
    "x[098-101,7]": ["x098", "x099", "x100", "x101", "x7"],
    "n[8-010]": ["n8", "n9", "n10"],
    "n[08-9]": ["n08", "n09"],
    "n[007,0-0]": ["n007", "n0"],
    "n[01-03,7,09-10]": ["n01", "n02", "n03", "n7", "n09", "n10"],
}
BRACKETS_AND_TEXT = {
    "rack[1-2]-n[1-2]": ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"],
    "r[1-2]n[01-02]": ["r1n01", "r1n02", "r2n01", "r2n02"],
    "a[1,3][5-6]": ["a15", "a16", "a35", "a36"],
    "a-b[1-2],c-d": ["a-b1", "a-b2", "c-d"],
    "gpu[1-2]-ib": ["gpu1-ib", "gpu2-ib"],
    "gpu[9-10].ib,rack[2]-n[1-2]-ib": ["gpu9.ib", "gpu10.ib", "rack2-n1-ib", "rack2-n2-ib"],
}
ORDER_AND_REPEATS = {
    "node[3,1,1],a": ["node3", "node1", "node1", "a"],
    "b,a,b": ["b", "a", "b"],
    "n[1-2],n[2-3]": ["n1", "n2", "n2", "n3"],
    "n[10-11,2]": ["n10", "n11", "n2"],
    "rack[2,1]-n[1-2]": ["rack2-n1", "rack2-n2", "rack1-n1", "rack1-n2"],
}
MALFORMED = [
    "", "  ", "\t\n",                                    # empty lists
    "a,,b", ",a", "a,", "a, ,b",                         # empty items
    "a[1", "a]1", "a[1]]", "a[1,2", "a[1]-b[2",          # unbalanced brackets
    "a[[1]]", "a[1[2]]",                                 # nested brackets
    "a[]", "a[1-2],b[]",                                 # empty brackets
    "a[3-1]", "n[10-9]", "n[1-3,5-4]",                   # ranges that run backwards
    "a[x]", "a[1-]", "a[-1]", "a[1,]", "a[,1]", "a[1-2-3]", "a[1-x]", "a[1x]",  # not numbers
]
# Every list the grading expands, and those SLURM 22.05 refuses: text after the last bracket
# (tests/project/test_lesson5_exercises.py).
NODE_LISTS = {**AS_JOBS_GET_THEM, **PLAIN_AND_WHITE_SPACE, **WIDTHS, **BRACKETS_AND_TEXT,
              **ORDER_AND_REPEATS}
SLURM_REFUSES = {"gpu[1-2]-ib", "gpu[9-10].ib,rack[2]-n[1-2]-ib"}


@pytest.mark.l5_expand_nodelist
@pytest.mark.usefixtures("no_scontrol")
@pytest.mark.points(3)
def test_node_lists_as_jobs_get_them(ex):
    """Padding, several brackets, text after a bracket, order: one list each; and three node
    lists drawn at grading time (hidden.py)."""
    hidden = drawn("expand_nodelist")
    assert_all_right({**AS_JOBS_GET_THEM, **dict(drawn_nodelist(hidden) for _ in range(3))},
                     ex.expand_nodelist, expanded)


def drawn_nodelist(hidden):
    """(a node list, the hosts it names), made together: names, one bracket or none each, of
    ranges whose numbers are as wide as their first bound, and single numbers."""
    text, hosts = [], []
    for _ in range(hidden.randint(1, 3)):
        name = "".join(hidden.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3))
        if hidden.random() < 0.3:
            text.append(f"{name}{hidden.randint(0, 99)}")
            hosts.append(text[-1])
            continue
        parts = []
        for _ in range(hidden.randint(1, 2)):
            low = hidden.randint(0, 120)
            width = hidden.randint(len(str(low)), 3)
            if hidden.random() < 0.3:
                parts.append(str(low))
                hosts.append(f"{name}{low}")
            else:
                high = low + hidden.randint(1, 4)
                parts.append(f"{low:0{width}d}-{high:0{width}d}")
                hosts += [f"{name}{i:0{width}d}" for i in range(low, high + 1)]
        text.append(f"{name}[{','.join(parts)}]")
    return ",".join(text), hosts


@pytest.mark.l5_expand_nodelist
@pytest.mark.usefixtures("no_scontrol")
@pytest.mark.points(1)
def test_plain_names_and_white_space_around_items(ex):
    assert_all_right(PLAIN_AND_WHITE_SPACE, ex.expand_nodelist, expanded)


@pytest.mark.l5_expand_nodelist
@pytest.mark.usefixtures("no_scontrol")
@pytest.mark.points(1)
def test_range_numbers_as_wide_as_the_first_bound(ex):
    assert_all_right(WIDTHS, ex.expand_nodelist, expanded)


@pytest.mark.l5_expand_nodelist
@pytest.mark.usefixtures("no_scontrol")
@pytest.mark.points(1)
def test_several_brackets_and_text_around_them(ex):
    assert_all_right(BRACKETS_AND_TEXT, ex.expand_nodelist, expanded)


@pytest.mark.l5_expand_nodelist
@pytest.mark.usefixtures("no_scontrol")
@pytest.mark.points(1)
def test_order_and_repeats_kept(ex):
    assert_all_right(ORDER_AND_REPEATS, ex.expand_nodelist, expanded)


@pytest.mark.l5_expand_nodelist
@pytest.mark.usefixtures("no_scontrol")
@pytest.mark.points(1)
def test_malformed_node_lists_are_refused(ex):
    assert_all_refused(ValueError, MALFORMED, ex.expand_nodelist, expanded)


# --- l5_slurm_identity -------------------------------------------------------------------
# SLURM_TASKS_PER_NODE -> the task count of each node

TASK_COUNTS = {"4": [4], "1": [1], "2(x3),1": [2, 2, 2, 1], "1,3(x2)": [1, 3, 3],
               "3,1,2(x2)": [3, 1, 2, 2], "1(x2),4,2(x3)": [1, 1, 4, 2, 2, 2],
               "12(x2)": [12, 12]}
TASK_COUNTS_REFUSED = [
    ("2(x3),1", 4), ("2(x3),1", -1), ("4", 1), ("4", -1),  # no such node
    ("two", 0), ("", 0), ("2,,1", 0), ("2(x3),1,", 0), ("(x2)", 0),
    ("2(3)", 0), ("2(x3", 0), ("2(xa)", 0), ("2x3", 0),
    ("2,x", 0), ("2(x2),1(y3)", 0),                    # malformed after node 0's part
]


@pytest.mark.l5_slurm_identity
@pytest.mark.points(2)
def test_tasks_on_every_node(ex):
    cases = {(text, node): count for text, counts in TASK_COUNTS.items()
             for node, count in enumerate(counts)}
    assert_all_right(cases, lambda case: ex.tasks_on_node(*case),
                     lambda case: f"tasks_on_node{case!r}")


@pytest.mark.l5_slurm_identity
@pytest.mark.points(1)
def test_tasks_on_node_refuses_nodes_and_text_it_cannot_read(ex):
    assert_all_refused(ValueError, TASK_COUNTS_REFUSED, lambda case: ex.tasks_on_node(*case),
                       lambda case: f"tasks_on_node{case!r}")


def srun_job(tasks_per_node, counts, nodelist, hosts, cyclic=False, **more):
    """[(srun's variables, the identity wanted)] for every process of a job whose node n runs
    counts[n] tasks. srun hands out global ranks node by node (its block distribution), or one
    per node in turn (--distribution=cyclic)."""
    placed, local = [], [0] * len(counts)  # placed[rank] = (node, local rank)
    order = (n for turn in range(max(counts)) for n in range(len(counts)) if turn < counts[n])
    for node in order if cyclic else (n for n, c in enumerate(counts) for _ in range(c)):
        placed.append((node, local[node]))
        local[node] += 1
    return [({"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local_rank),
              "SLURM_NTASKS": str(len(placed)), "SLURM_NODEID": str(node),
              "SLURM_TASKS_PER_NODE": tasks_per_node, "SLURM_JOB_NODELIST": nodelist,
              "SLURM_NNODES": str(len(counts)), "SLURMD_NODENAME": hosts[node],
              "SLURM_JOB_ID": "4242", **more},
             {"rank": rank, "local_rank": local_rank, "world_size": len(placed),
              "local_world_size": counts[node], "node_rank": node, "master_addr": hosts[0]})
            for rank, (node, local_rank) in enumerate(placed)]


@pytest.fixture
def own_expand_nodelist(ex):
    """identity_from_slurm graded on its own: while it runs, the submission's expand_nodelist
    is the grader's (probes.lesson5_expand_nodelist, which reads the easy shapes below), so a
    mistake there costs l5_expand_nodelist alone."""
    with ex.options(replace={"expand_nodelist": "lesson5_expand_nodelist"}):
        yield


SRUN_JOBS = {  # the node lists keep to easy shapes: the identity, not the expander, is graded
    "8 tasks on 4 nodes running 3, 1, 2, 2":
        srun_job("3,1,2(x2)", [3, 1, 2, 2], "gpu[2-5]", ["gpu2", "gpu3", "gpu4", "gpu5"]),
    "srun -n 7 --ntasks-per-node=2 on 4 nodes":
        srun_job("2(x3),1", [2, 2, 2, 1], "node[5-7],login1",
                 ["node5", "node6", "node7", "login1"], SLURM_NTASKS_PER_NODE="2"),
    "4 tasks on 2 nodes, --distribution=cyclic":
        srun_job("2(x2)", [2, 2], "host[3-4]", ["host3", "host4"], cyclic=True),
    "one task": srun_job("1", [1], "laptop", ["laptop"]),
}


@pytest.mark.l5_slurm_identity
@pytest.mark.usefixtures("own_expand_nodelist")
@pytest.mark.points(4)
def test_identity_of_every_process_srun_started(ex):
    wrong = [f"identity_from_slurm(srun's variables of {job}, rank {want['rank']}) "
             f"{said(got)}, expected {want}"
             for job, processes in SRUN_JOBS.items() for environ, want in processes
             if (got := outcome(lambda e=environ: ex.identity_from_slurm(dict(e)))) != want]
    assert not wrong, "\n".join(wrong[:6])


NEEDED = ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID",
          "SLURM_TASKS_PER_NODE", "SLURM_JOB_NODELIST"]


@pytest.mark.l5_slurm_identity
@pytest.mark.usefixtures("own_expand_nodelist")
@pytest.mark.points(1)
def test_identity_outside_srun_names_what_is_missing(ex):
    full = SRUN_JOBS["8 tasks on 4 nodes running 3, 1, 2, 2"][5][0]
    cases = [(NEEDED, {"HOME": "/home/student", "SLURM_JOB_ID": "4242"})] + [
        (missing, {k: v for k, v in full.items() if k not in missing})
        for missing in [[name] for name in NEEDED] + [["SLURM_NODEID", "SLURM_JOB_NODELIST"]]]
    for missing, environ in cases:
        with pytest.raises(RuntimeError) as raised:
            ex.identity_from_slurm(environ)
        unnamed = [name for name in missing if not re.search(rf"\b{name}\b", str(raised.value))]
        assert not unnamed, f"without {missing} the error must name {unnamed}: {raised.value}"


# --- l5_process_devices ------------------------------------------------------------------

def torchrun_environ(local_rank, local_world_size, node, nodes):
    rank = node * local_world_size + local_rank
    return {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_world_size),
            "RANK": str(rank), "WORLD_SIZE": str(nodes * local_world_size),
            "GROUP_RANK": str(node), "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}


@pytest.mark.l5_process_devices
@pytest.mark.points(2)
def test_devices_of_each_process(ex):
    """GPUs per process unlike processes per node (8 at 2 each: 4 processes), and alike."""
    layouts = [(4, 2), (8, 2), (8, 4), (6, 3), (6, 2), (6, 1), (8, 8), (3, 1), (1, 1)]
    cases = {(local_rank, gpus, k): list(range(local_rank * k, local_rank * k + k))
             for gpus, k in layouts for local_rank in range(gpus // k)}
    assert_all_right(cases, lambda case: ex.process_devices(*case),
                     lambda case: f"process_devices{case!r}")


@pytest.mark.l5_process_devices
@pytest.mark.points(1)
def test_impossible_layouts_are_refused(ex):
    assert_all_refused(ValueError, [(2, 4, 2), (-1, 4, 2), (4, 8, 2), (2, 8, 4), (0, 4, 3),
                                    (0, 6, 4), (0, 4, 0), (0, 4, -2), (0, 4, 8)],
                       lambda case: ex.process_devices(*case),
                       lambda case: f"process_devices{case!r}")
    # (GPUs per node, processes per node): the GPUs do not split evenly over the processes
    assert_all_refused(ValueError, [(6, 4), (4, 3), (2, 4), (8, 3)],
                       lambda case: ex.my_devices(torchrun_environ(0, case[1], 0, 1), case[0]),
                       lambda case: f"my_devices(torchrun's variables of local rank 0 of "
                                    f"{case[1]} per node, gpus_per_node={case[0]})")


@pytest.mark.l5_process_devices
@pytest.mark.points(1)
def test_my_devices_from_torchruns_variables(ex):
    """(local rank, processes per node, node, nodes, GPUs per node) -> the GPUs owned."""
    cases = {(1, 2, 1, 2, 8): [4, 5, 6, 7], (0, 2, 1, 2, 8): [0, 1, 2, 3],
             (2, 3, 0, 1, 6): [4, 5], (1, 3, 1, 2, 6): [2, 3], (0, 3, 1, 2, 3): [0],
             (0, 1, 0, 1, 4): [0, 1, 2, 3], (1, 2, 2, 3, 6): [3, 4, 5]}
    assert_all_right(cases, lambda case: ex.my_devices(torchrun_environ(*case[:4]), case[4]),
                     lambda case: f"my_devices(torchrun's variables of local rank {case[0]} of "
                                  f"{case[1]} on node {case[2]} of {case[3]}, "
                                  f"gpus_per_node={case[4]})")


@pytest.mark.l5_process_devices
@pytest.mark.points(3)
def test_devices_in_a_job_of_two_nodes(ex):
    """Two simulated nodes of 2 processes, 6 GPUs each: on each node local ranks 0 and 1 own
    GPUs 0-2 and 3-5, whatever their global rank."""
    ex.my_devices(torchrun_environ(1, 2, 1, 2), 6)  # fail fast, before a launch
    line = verdict(judged(JOBS[4], {"devices": ("devices", judge_devices)}), "devices")
    assert line == "devices: ok on 4 ranks", (
        f"my_devices(torchrun's variables, 6) in a job of 2 nodes x 2 processes: {line}")


def judge_devices(seen, nodes=2, per_node=2, gpus_per_node=6):
    """Rank r of the job is node r // per_node, local rank r % per_node: it owns the local
    rank's run of gpus_per_node // per_node consecutive GPUs."""
    problems, share = [], gpus_per_node // per_node
    for rank, devices in enumerate(seen):
        node, local_rank = divmod(rank, per_node)
        want = list(range(local_rank * share, (local_rank + 1) * share))
        if not isinstance(devices, (list, tuple)) or list(devices) != want:
            problems.append(f"node {node}, local rank {local_rank} claims GPUs {devices}; "
                            f"with {gpus_per_node} GPUs over {per_node} processes it owns {want}")
    return problems, ""
