"""Lesson 1 reference solutions (kept out of the student release)."""

from __future__ import annotations

from collections.abc import Mapping

from ddpcourse.topology import Process


def _require_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def global_rank(node_rank: int, local_rank: int, procs_per_node: int) -> int:
    _require_count("procs_per_node", procs_per_node)
    _require_count("node_rank", node_rank, minimum=0)
    _require_count("local_rank", local_rank, minimum=0)
    if local_rank >= procs_per_node:
        raise ValueError(f"local rank {local_rank} does not exist on a node of "
                         f"{procs_per_node} processes")
    return node_rank * procs_per_node + local_rank


def rank_layout(nodes: int, gpus_per_node: int, gpus_per_process: int = 1) -> list[Process]:
    _require_count("nodes", nodes)
    _require_count("gpus_per_node", gpus_per_node)
    _require_count("gpus_per_process", gpus_per_process)
    procs_per_node, leftover = divmod(gpus_per_node, gpus_per_process)
    if leftover:
        raise ValueError(f"{gpus_per_node} GPUs per node do not split into processes of "
                         f"{gpus_per_process} GPUs ({leftover} would be left over)")
    processes = []
    for node in range(nodes):
        first_gpu = 0
        for local_rank in range(procs_per_node):
            gpus = tuple(range(first_gpu, first_gpu + gpus_per_process))
            first_gpu += gpus_per_process
            processes.append(Process(global_rank(node, local_rank, procs_per_node), node,
                                     local_rank, gpus))
    return processes


def node_groups(nodes: int, procs_per_node: int) -> list[list[int]]:
    _require_count("nodes", nodes)
    _require_count("procs_per_node", procs_per_node)
    return [list(range(n * procs_per_node, (n + 1) * procs_per_node)) for n in range(nodes)]


def identity_from_env(environ: Mapping[str, str]) -> dict[str, int]:
    missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if k not in environ]
    if missing:
        raise RuntimeError(
            f"not started by a launcher: {', '.join(missing)} not set. "
            "Start it with torchrun, e.g. torchrun --nproc-per-node=2 script.py"
        )
    rank = int(environ["RANK"])
    local_rank = int(environ["LOCAL_RANK"])
    world_size = int(environ["WORLD_SIZE"])
    local_world_size = int(environ.get("LOCAL_WORLD_SIZE", world_size))
    node = environ.get("GROUP_RANK", environ.get("NODE_RANK"))
    node_rank = int(node) if node is not None else rank // local_world_size
    return {"rank": rank, "local_rank": local_rank, "world_size": world_size,
            "local_world_size": local_world_size, "node_rank": node_rank}
