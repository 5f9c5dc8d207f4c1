"""Lesson 5 exercises: a cluster's node list, a process's identity under SLURM, and the devices a
process owns when it spans several GPUs.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=5                                   # all of lesson 5, with a score table
    .venv/bin/pytest tests/grading -m l5_expand_nodelist   # one exercise

The last exercise is also checked inside a real job: the grader starts it with torchrun on two
simulated nodes and checks that no two processes claim the same device.
"""

from __future__ import annotations

from collections.abc import Mapping


def expand_nodelist(nodelist: str) -> list[str]:
    """Exercise l5_expand_nodelist: the host names in a SLURM node list, in order.

    SLURM writes the nodes of a job compactly (SLURM_JOB_NODELIST): comma-separated items, in
    which a bracket holds comma-separated numbers and ranges, e.g.

        "node[01-03,07],gpu5"  ->  ["node01", "node02", "node03", "node07", "gpu5"]

    - a range keeps its zero padding: [08-10] gives 08, 09, 10 (the width of its first bound);
    - an item may hold several brackets: "rack[1-2]-n[1-2]" gives rack1-n1, rack1-n2,
      rack2-n1, rack2-n2 (the last bracket varies fastest);
    - the order and any repeats are kept, as `scontrol show hostnames` keeps them;
    - surrounding white space is ignored.

    Raise ValueError for an empty list, an empty item, an unbalanced or nested bracket, an
    empty bracket, a range whose end is below its start, or anything that is not a number
    inside a bracket.
    """
    raise NotImplementedError("l5_expand_nodelist: expand SLURM's compact node list")


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Exercise l5_slurm_identity: how many tasks SLURM started on node `node_id`.

    SLURM_TASKS_PER_NODE lists the task count of each node in node order, compressing runs of
    equal counts: "2(x3),1" means nodes 0, 1 and 2 run 2 tasks each and node 3 runs 1.
    Raise ValueError when node_id is not one of the listed nodes or the text is malformed.
    """
    raise NotImplementedError("l5_slurm_identity: read SLURM_TASKS_PER_NODE")


def identity_from_slurm(environ: Mapping[str, str]) -> dict:
    """Exercise l5_slurm_identity: a process's identity in a job that `srun` started.

    srun starts every process itself (no torchrun) and describes it with its own variables:
    SLURM_PROCID (global rank), SLURM_LOCALID (rank on this node), SLURM_NTASKS (world size),
    SLURM_NODEID (node rank), SLURM_TASKS_PER_NODE (see tasks_on_node) and
    SLURM_JOB_NODELIST (see expand_nodelist). Return what init_process_group's env:// needs
    and what lesson 1 calls the identity:

        {"rank": ..., "local_rank": ..., "world_size": ..., "local_world_size": ...,
         "node_rank": ..., "master_addr": the first host of the job's node list}

    The counts per node may differ (SLURM_TASKS_PER_NODE="2(x3),1"). Raise RuntimeError
    naming the missing variables when any of these six is not set.
    """
    raise NotImplementedError("l5_slurm_identity: read srun's variables")


def process_devices(local_rank: int, gpus_per_node: int, gpus_per_process: int) -> list[int]:
    """Exercise l5_process_devices: the GPUs a process owns when it spans several of them.

    Each process of a node drives `gpus_per_process` GPUs of its own, in order: local rank 0
    gets GPUs 0..k-1, local rank 1 gets k..2k-1, and so on (on every node alike). Return the
    indices for `local_rank`. Raise ValueError when gpus_per_process is below 1, when it does
    not divide gpus_per_node, or when local_rank is not a process of this node
    (0 <= local_rank < gpus_per_node // gpus_per_process).
    """
    raise NotImplementedError("l5_process_devices: work out which GPUs this process owns")


def my_devices(environ: Mapping[str, str], gpus_per_node: int) -> list[int]:
    """Exercise l5_process_devices: the GPUs this process owns, from the launcher's variables.

    torchrun started LOCAL_WORLD_SIZE processes on this node, which has `gpus_per_node` GPUs:
    each process spans gpus_per_node // LOCAL_WORLD_SIZE of them. Use process_devices with
    this process's LOCAL_RANK. Raise ValueError when the node's GPUs do not split evenly over
    its processes. (The grader runs this on two simulated nodes: think about which rank and
    which world size describe this node.)
    """
    raise NotImplementedError("l5_process_devices: read the launcher's variables")
