"""Lesson 4 reference solutions (kept out of the student release)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist


def _exchange(outgoing: torch.Tensor, dst: int, incoming: torch.Tensor, src: int) -> None:
    """Send `outgoing` to dst while receiving `incoming` from src (both may be empty).

    Both directions are posted together (batch_isend_irecv), so a ring of ranks that all send
    at once cannot deadlock, on gloo or nccl. Empty pieces are skipped; the peer skips the
    same piece, since it has the same size on both sides.
    """
    ops = []
    if outgoing.numel():
        ops.append(dist.P2POp(dist.isend, outgoing, dst))
    if incoming.numel():
        ops.append(dist.P2POp(dist.irecv, incoming, src))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    chunks = list(flat.tensor_split(world))  # views; sizes differ by at most one
    right, left = (rank + 1) % world, (rank - 1) % world
    incoming = torch.empty_like(chunks[0])  # chunk 0 is the largest
    # Reduce-scatter: after W-1 steps rank r holds the full sum of chunk r+1.
    for step in range(world - 1):
        send, recv = (rank - step) % world, (rank - step - 1) % world
        buffer = incoming[: chunks[recv].numel()]
        _exchange(chunks[send], right, buffer, left)
        chunks[recv] += buffer
    # All-gather: pass the finished sums around the ring, overwriting the partial ones.
    for step in range(world - 1):
        send, recv = (rank + 1 - step) % world, (rank - step) % world
        _exchange(chunks[send], right, chunks[recv], left)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def all_gather_p2p(tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    if len(tensor_list) != world:
        raise ValueError(f"tensor_list has {len(tensor_list)} tensors; it needs one per rank "
                         f"({world})")
    tensor_list[rank].copy_(tensor)
    right, left = (rank + 1) % world, (rank - 1) % world
    # A ring again: in step s every rank passes on the tensor it got in step s-1.
    for step in range(world - 1):
        send, recv = (rank - step) % world, (rank - step - 1) % world
        _exchange(tensor_list[send], right, tensor_list[recv], left)


def tree_broadcast(tensor: torch.Tensor, src: int) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    if not 0 <= src < world:
        raise ValueError(f"src {src} is not a rank of a world of {world}")
    me = (rank - src) % world  # position in the tree: the root is 0
    # Binomial tree: in the round with distance d = 1, 2, 4, ... every process that already
    # has the data (me < d) sends it to me + d. After ceil(log2 W) rounds everyone has it.
    distance = 1
    while distance < world:
        if me < distance:
            if me + distance < world:
                dist.send(tensor, dst=(me + distance + src) % world)
        elif me < 2 * distance:
            dist.recv(tensor, src=(me - distance + src) % world)
        distance *= 2


def node_group(environ: Mapping[str, str] | None = None,
               timeout: timedelta = timedelta(seconds=60)):
    env = os.environ if environ is None else environ
    world = int(env["WORLD_SIZE"])
    per_node = int(env["LOCAL_WORLD_SIZE"])
    node = int(env["GROUP_RANK"])
    if world % per_node:
        raise ValueError(f"{world} processes do not split into nodes of {per_node}")
    # Every process creates every node's group, in the same order, and keeps its own.
    groups = [dist.new_group(list(range(n * per_node, (n + 1) * per_node)), timeout=timeout)
              for n in range(world // per_node)]
    return groups[node]


def node_leader_broadcast(tensor: torch.Tensor, group) -> None:
    # src is a global rank: the group's rank 0 translated.
    dist.broadcast(tensor, src=dist.get_global_rank(group, 0), group=group)


def report_loss(loss: torch.Tensor, rank: int) -> float | None:
    total = loss.detach().clone()
    dist.all_reduce(total)  # every rank takes part; only the printing is rank 0's job
    mean = total.item() / dist.get_world_size()
    if rank == 0:
        print(f"mean loss over {dist.get_world_size()} ranks: {mean:.4f}", flush=True)
        return mean
    return None
