"""Lesson 5 reference solutions (kept out of the student release)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import product

ITEM_PART = re.compile(r"\[([^\[\]]*)\]|([^\[\]]+)")


def _bracket_values(inside: str) -> list[str]:
    if not inside:
        raise ValueError("an empty bracket []")
    values = []
    for part in inside.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{part!r} is not a number or a range of numbers")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"the range {part!r} runs backwards")
        values += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return values


def _split_items(nodelist: str) -> list[str]:
    """Split at the commas that are outside brackets."""
    items, depth, current = [], 0, ""
    for char in nodelist:
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError("nested brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("a ']' without its '['")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError("a '[' without its ']'")
    return items + [current]


def expand_nodelist(nodelist: str) -> list[str]:
    if not nodelist.strip():
        raise ValueError("an empty node list")
    hosts = []
    for item in _split_items(nodelist.strip()):
        item = item.strip()
        if not item:
            raise ValueError(f"an empty item in {nodelist!r}")
        choices = []
        for bracket, text in ITEM_PART.findall(item):
            choices.append(_bracket_values(bracket) if text == "" else [text])
        if "".join("[" + b + "]" if t == "" else t for b, t in ITEM_PART.findall(item)) != item:
            raise ValueError(f"cannot read {item!r}")
        hosts += ["".join(parts) for parts in product(*choices)]
    return hosts


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    counts = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"cannot read {part!r} in SLURM_TASKS_PER_NODE={tasks_per_node!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if not 0 <= node_id < len(counts):
        raise ValueError(f"node {node_id} is not among the {len(counts)} nodes listed")
    return counts[node_id]


NEEDED = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID",
          "SLURM_TASKS_PER_NODE", "SLURM_JOB_NODELIST")


def identity_from_slurm(environ: Mapping[str, str]) -> dict:
    missing = [name for name in NEEDED if name not in environ]
    if missing:
        raise RuntimeError(f"not started by srun: {', '.join(missing)} not set")
    node_rank = int(environ["SLURM_NODEID"])
    return {"rank": int(environ["SLURM_PROCID"]),
            "local_rank": int(environ["SLURM_LOCALID"]),
            "world_size": int(environ["SLURM_NTASKS"]),
            "local_world_size": tasks_on_node(environ["SLURM_TASKS_PER_NODE"], node_rank),
            "node_rank": node_rank,
            "master_addr": expand_nodelist(environ["SLURM_JOB_NODELIST"])[0]}


def process_devices(local_rank: int, gpus_per_node: int, gpus_per_process: int) -> list[int]:
    if gpus_per_process < 1 or gpus_per_node < 1 or gpus_per_node % gpus_per_process:
        raise ValueError(f"{gpus_per_process} GPUs per process do not divide a node's "
                         f"{gpus_per_node} GPUs")
    processes = gpus_per_node // gpus_per_process
    if not 0 <= local_rank < processes:
        raise ValueError(f"local rank {local_rank}: a node runs processes 0..{processes - 1}")
    first = local_rank * gpus_per_process
    return list(range(first, first + gpus_per_process))


def my_devices(environ: Mapping[str, str], gpus_per_node: int) -> list[int]:
    processes = int(environ["LOCAL_WORLD_SIZE"])
    if gpus_per_node % processes:
        raise ValueError(f"{gpus_per_node} GPUs do not split over {processes} processes")
    return process_devices(int(environ["LOCAL_RANK"]), gpus_per_node, gpus_per_node // processes)
