"""Lesson 5 exercises: a cluster's node list, a process's identity under SLURM, and the devices a
process owns when it spans several GPUs.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=5                                   # all of lesson 5, with a score table
    .venv/bin/pytest tests/grading -m l5_expand_nodelist   # one exercise

Each docstring ends with what the grader checks. The last exercise is also checked inside a
real job: the grader starts it with torchrun on two simulated nodes and checks which devices
each process claims.
"""

from __future__ import annotations

from collections.abc import Mapping


def expand_nodelist(nodelist: str) -> list[str]:
    """Exercise l5_expand_nodelist: the host names in a SLURM node list, in order.

    SLURM writes the nodes of a job compactly (SLURM_JOB_NODELIST): comma-separated items. An
    item is a host name in which brackets may stand; a bracket holds comma-separated numbers
    and ranges (`low-high`, both ends included; a number is one or more of the digits 0-9):

        "node[01-03,07],gpu5"  ->  ["node01", "node02", "node03", "node07", "gpu5"]

    - every number a range gives is written with as many digits as the range's first bound
      has, zeros in front where it is shorter: [08-10] gives 08, 09, 10, and [8-10] gives
      8, 9, 10; a single number is written as it stands ([007] gives 007);
    - an item may hold several brackets, with text before, between and after them:
      "rack[1-2]-n[1-2]" gives rack1-n1, rack1-n2, rack2-n1, rack2-n2 (the last bracket
      varies fastest), and "gpu[1-2]-ib" gives gpu1-ib, gpu2-ib;
    - the order of the items and of the numbers in a bracket is kept, and so are repeats, as
      `scontrol show hostnames` keeps them ("b,a,b" gives b, a, b);
    - white space (spaces, tabs, newlines) may stand at either end of the list and on either
      side of a comma between items, and is ignored there. The grader puts it nowhere else.

    Raise ValueError for: an empty list (nothing, or only white space); an empty item ("a,,b",
    or a comma at either end); a '[' without its ']' or a ']' without its '['; a bracket
    inside a bracket; an empty bracket "[]"; a range whose end is below its start ("[3-1]");
    anything in a bracket that is not a number or a range of two numbers ("[x]", "[1-]",
    "[1,]", "[-1]", "[1-2-3]").

    Graded: lists of every shape above, with ranges whose bounds have different widths, as a
    real job's list and one shape at a time; each error above. The expected names are what
    SLURM's `scontrol show hostnames` prints, except for text after an item's last bracket,
    a form SLURM 22.05 refuses and never writes. Expand the list yourself: code that asks
    scontrol (or any other program) scores zero.
    """
    raise NotImplementedError("l5_expand_nodelist: expand SLURM's compact node list")


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Exercise l5_slurm_identity: how many tasks SLURM started on node `node_id`.

    SLURM_TASKS_PER_NODE lists the task count of each node in node order, compressing runs of
    equal counts: each comma-separated part is a count, alone or followed by "(xN)" when N
    nodes in a row run that many tasks. "2(x3),1" means nodes 0, 1 and 2 run 2 tasks each and
    node 3 runs 1; "3,1,2(x2)" means 3, 1, 2 and 2.

    Raise ValueError when node_id is not one of the listed nodes (negative ones included), or
    when any part of the text is malformed, also a part after node_id's: an empty part, a
    count that is not a number, a repeat not written "(xN)" with N a number.

    Graded: every node of even and uneven layouts, with and without repeats; each error above.
    """
    raise NotImplementedError("l5_slurm_identity: read SLURM_TASKS_PER_NODE")


def identity_from_slurm(environ: Mapping[str, str]) -> dict:
    """Exercise l5_slurm_identity: a process's identity in a job that `srun` started.

    srun starts every process itself (no torchrun) and describes it with its own variables:
    SLURM_PROCID (global rank), SLURM_LOCALID (rank on this node), SLURM_NTASKS (world size),
    SLURM_NODEID (node rank), SLURM_TASKS_PER_NODE (see tasks_on_node) and
    SLURM_JOB_NODELIST (see expand_nodelist). Read them from `environ` (the mapping given, not
    os.environ) and return what init_process_group's env:// needs and what lesson 1 calls the
    identity, exactly these six keys, the first five ints and master_addr a str:

        {"rank": ..., "local_rank": ..., "world_size": ..., "local_world_size": ...,
         "node_rank": ..., "master_addr": the first host of the job's node list}

    The counts per node may differ (SLURM_TASKS_PER_NODE="2(x3),1"). Raise RuntimeError
    naming every one of the six variables that is not set, when any is not.

    Graded: every key, for every process of several jobs (nodes running different numbers of
    tasks; ranks handed out node by node, or one node after another in turn as
    `srun --distribution=cyclic` does) and of a one-process job. The environments hold the other
    variables srun sets as well (SLURM_NNODES, SLURMD_NODENAME, and SLURM_NTASKS_PER_NODE where
    the job asked for a count per node). The RuntimeError with none of the six set, and with
    one or two missing.
    """
    raise NotImplementedError("l5_slurm_identity: read srun's variables")


def process_devices(local_rank: int, gpus_per_node: int, gpus_per_process: int) -> list[int]:
    """Exercise l5_process_devices: the GPUs a process owns when it spans several of them.

    Each process of a node drives `gpus_per_process` GPUs of its own, in order: local rank 0
    gets GPUs 0..k-1, local rank 1 gets k..2k-1, and so on (on every node alike). Return the
    indices for `local_rank`, in increasing order. Raise ValueError when gpus_per_process is
    below 1, when it does not divide gpus_per_node, or when local_rank is not a process of
    this node (0 <= local_rank < gpus_per_node // gpus_per_process).

    Graded: every local rank of layouts where the GPUs per process and the processes per node
    differ (8 GPUs at 2 per process make 4 processes) and where they are equal; each error.
    """
    raise NotImplementedError("l5_process_devices: work out which GPUs this process owns")


def my_devices(environ: Mapping[str, str], gpus_per_node: int) -> list[int]:
    """Exercise l5_process_devices: the GPUs this process owns, from the launcher's variables.

    torchrun started LOCAL_WORLD_SIZE processes on this node, which has `gpus_per_node` GPUs:
    each process spans gpus_per_node // LOCAL_WORLD_SIZE of them. Use process_devices with
    this process's LOCAL_RANK, read from `environ` (the mapping given, not os.environ). Raise
    ValueError when the node's GPUs do not split evenly over its processes. (Think about which
    rank and which world size describe this node.)

    Graded: environments as torchrun writes them (RANK, WORLD_SIZE and GROUP_RANK too) for
    processes of jobs of one to three nodes, most with GPUs per process unlike processes per
    node; the ValueError; and inside a real torchrun job of two simulated nodes x 2 processes
    with 6 GPUs per node, every process's answer.
    """
    raise NotImplementedError("l5_process_devices: read the launcher's variables")
