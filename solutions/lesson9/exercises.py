"""Lesson 9 reference solutions (see lessons/lesson9/exercises.py for the tasks)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

# --- l9_launcher_identity ------------------------------------------------------------------


def _ints(environ: Mapping[str, str], names: Sequence[str]) -> list[int]:
    values = []
    for name in names:
        try:
            values.append(int(environ[name]))
        except ValueError:
            raise ValueError(f"{name}={environ[name]!r} is not a whole number") from None
    return values


def _local_rank_argument(argv: Sequence[str]) -> int | None:
    for i, word in enumerate(argv):
        found = re.fullmatch(r"--local[_-]rank(?:=(.*))?", word)
        if found:
            value = found.group(1) if found.group(1) is not None else (
                argv[i + 1] if i + 1 < len(argv) else "")
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"--local_rank {value!r} is not a whole number") from None
    return None


def identity_from_launcher(environ: Mapping[str, str], argv: Sequence[str] = (),
                           devices_per_node: int | None = None) -> dict[str, int]:
    if all(k in environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        rank, local, world = _ints(environ, ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        node_name = next((k for k in ("GROUP_RANK", "CROSS_RANK", "NODE_RANK") if k in environ),
                         None)
        size_name = next((k for k in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE") if k in environ), None)
        per_node = _ints(environ, [size_name])[0] if size_name else devices_per_node
        if node_name:
            node = _ints(environ, [node_name])[0]
        elif per_node:
            node = rank // per_node
        else:
            node = 0
        where = "RANK, LOCAL_RANK"
    elif all(k in environ for k in ("LOCAL_RANK", "WORLD_SIZE")):
        # Lightning's own launcher: no RANK. Its children follow from the node and the devices.
        local, world = _ints(environ, ("LOCAL_RANK", "WORLD_SIZE"))
        node = _ints(environ, ["NODE_RANK"])[0] if "NODE_RANK" in environ else 0
        if not devices_per_node:
            raise ValueError("LOCAL_RANK and WORLD_SIZE without RANK (Lightning's launcher): "
                             "the global rank needs devices_per_node")
        per_node, rank, where = devices_per_node, node * devices_per_node + local, "NODE_RANK"
    elif all(k in environ for k in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                    "OMPI_COMM_WORLD_LOCAL_RANK")):
        rank, world, local = _ints(environ, ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                             "OMPI_COMM_WORLD_LOCAL_RANK"))
        per_node = (_ints(environ, ["OMPI_COMM_WORLD_LOCAL_SIZE"])[0]
                    if "OMPI_COMM_WORLD_LOCAL_SIZE" in environ else devices_per_node)
        node = rank // per_node if per_node else 0
        where = "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK"
    elif all(k in environ for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")):
        rank, local, world = _ints(environ, ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"))
        node = _ints(environ, ["SLURM_NODEID"])[0] if "SLURM_NODEID" in environ else 0
        per_node, where = None, "SLURM_PROCID, SLURM_LOCALID"
    else:
        raise ValueError("no launcher's variables (RANK/LOCAL_RANK/WORLD_SIZE, Lightning's "
                         "LOCAL_RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*): not launched")

    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not one of a world of {world}")
    if local < 0 or node < 0 or per_node is not None and not 0 <= local < per_node:
        raise ValueError(f"local rank {local} or node rank {node} impossible "
                         f"with {per_node} processes per node")
    if per_node and (world % per_node or rank != node * per_node + local):
        raise ValueError(f"{where} say rank {rank}, but node {node} x {per_node} per node "
                         f"+ local rank {local} is {node * per_node + local} (world {world})")
    argument = _local_rank_argument(argv)
    if argument is not None and argument != local:
        raise ValueError(f"--local_rank={argument} but the environment says {local}")
    return {"rank": rank, "local_rank": local, "node_rank": node, "world_size": world}


# --- l9_shard_loader -----------------------------------------------------------------------

def shard_loader(loader: DataLoader, rank: int, world_size: int, seed: int = 0) -> DataLoader:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of a world of {world_size}")
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler):
        if (sampler.num_replicas, sampler.rank) != (world_size, rank):
            raise ValueError(f"the loader is already sharded for rank {sampler.rank} of "
                             f"{sampler.num_replicas}, not {rank} of {world_size}")
        return loader  # sharding it again would leave this rank 1/W of its share
    # A batch sampler of its own (batch_size None) or another sampler: splitting it would
    # change what it does, so say so rather than guess.
    if loader.batch_size is None or not isinstance(sampler, (RandomSampler, SequentialSampler)) \
            or getattr(sampler, "replacement", False):
        raise ValueError(f"cannot shard a loader whose sampler is {type(sampler).__name__}")
    shuffle = isinstance(sampler, RandomSampler)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, drop_last=loader.drop_last,
                      collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                      pin_memory=loader.pin_memory,
                      sampler=DistributedSampler(loader.dataset, num_replicas=world_size,
                                                 rank=rank, shuffle=shuffle, seed=seed))


# --- l9_exact_validation -------------------------------------------------------------------

def exact_accuracy(indices: Sequence[int], correct: torch.Tensor, length: int,
                   group=None) -> float:
    indices = torch.as_tensor(list(indices), dtype=torch.long)
    correct = torch.as_tensor(correct).flatten()
    if len(indices) != len(correct):
        raise ValueError(f"{len(indices)} indices but {len(correct)} results")
    if length < 1 or len(indices) and not (0 <= int(indices.min()) and
                                           int(indices.max()) < length):
        raise ValueError(f"an index outside a validation set of {length}")
    # Per sample: how many times it was evaluated, and how many of those were right, over
    # every rank of the group. A sample evaluated twice (DistributedSampler's padding) is
    # right both times or neither: the same weights on every rank.
    seen = torch.zeros(2, length, dtype=torch.float64)
    seen[0].index_add_(0, indices, torch.ones(len(indices), dtype=torch.float64))
    seen[1].index_add_(0, indices, correct.to(torch.float64))
    dist.all_reduce(seen, group=group)
    if bool((seen[0] == 0).any()):
        missing = int((seen[0] == 0).nonzero()[0])
        raise ValueError(f"sample {missing} of {length} was evaluated by no rank")
    return float((seen[1] / seen[0]).sum() / length)
