"""Lesson 1 exercises: ranks, layouts, groups and the launcher's environment.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=1                        # all of lesson 1, with a score table
    .venv/bin/pytest tests/grading -m l1_global_rank   # one exercise

Write the arithmetic yourself: `ddpcourse.topology` holds the course's own answer (it draws
the diagrams), so calling it here teaches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddpcourse.topology import Process


def global_rank(node_rank: int, local_rank: int, procs_per_node: int) -> int:
    """Exercise l1_global_rank: the global rank of process `local_rank` on node `node_rank`.

    Every node runs `procs_per_node` processes. Raise ValueError when an argument is
    negative, `procs_per_node` is not positive, or `local_rank` does not exist on a node.
    Example: global_rank(1, 2, 4) == 6.
    """
    raise NotImplementedError("l1_global_rank: compute the global rank")


def rank_layout(nodes: int, gpus_per_node: int, gpus_per_process: int = 1) -> list[Process]:
    """Exercise l1_rank_layout: every process of a job, in global-rank order.

    The job has `nodes` nodes with `gpus_per_node` GPUs each, and every process drives
    `gpus_per_process` neighbouring GPUs of its node. Return one
    `Process(global_rank, node, local_rank, gpus)` per process, where `gpus` is the tuple of
    GPU indices on its node. Raise ValueError for a shape that cannot be built: a count that
    is not a positive int, or GPUs per node not divisible by GPUs per process.
    Example: rank_layout(2, 4, 2)[3] == Process(3, node=1, local_rank=1, gpus=(2, 3)).
    """
    raise NotImplementedError("l1_rank_layout: build the list of processes")


def node_groups(nodes: int, procs_per_node: int) -> list[list[int]]:
    """Exercise l1_node_groups: the global ranks on each node, one list per node.

    These are the ranks to pass to `dist.new_group` for one group per node.
    Example: node_groups(2, 2) == [[0, 1], [2, 3]]. Raise ValueError for counts below 1.
    """
    raise NotImplementedError("l1_node_groups: list the ranks of each node")


def identity_from_env(environ: Mapping[str, str]) -> dict[str, int]:
    """Exercise l1_identity: who this process is, from the variables the launcher sets.

    Return a dict with the int keys rank, local_rank, world_size, local_world_size and
    node_rank. torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK
    (the node rank); when GROUP_RANK is missing, use NODE_RANK, and failing that derive the
    node rank from the others, assuming every node runs local_world_size processes (the
    layout of section 3; graded with GROUP_RANK, with NODE_RANK only, and with neither).
    When RANK, LOCAL_RANK or WORLD_SIZE is missing the process was
    not started by a launcher: raise RuntimeError with a message that names the missing
    variables and says how to launch (torchrun). LOCAL_WORLD_SIZE may be missing too: then
    every process of the job is on one node.
    """
    raise NotImplementedError("l1_identity: read the launcher's environment variables")
