"""Lesson 10 reference solutions (see lessons/lesson10/exercises.py for the tasks)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

# --- l10_mesh_groups -----------------------------------------------------------------------


def _checked_shape(shape: Sequence[int]) -> tuple[int, ...]:
    sizes = tuple(shape)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"a mesh shape is one or more whole sizes >= 1, not {shape!r}")
    return sizes


def mesh_coordinates(rank: int, shape: Sequence[int]) -> tuple[int, ...]:
    sizes = _checked_shape(shape)
    count = math.prod(sizes)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < count:
        raise ValueError(f"rank {rank!r} is not one of the {count} ranks of a {sizes} mesh")
    backwards = []
    for size in reversed(sizes):  # row-major: peel the fastest dimension off first
        rank, coordinate = divmod(rank, size)
        backwards.append(coordinate)
    return tuple(reversed(backwards))


def mesh_groups(shape: Sequence[int], names: Sequence[str],
                timeout: timedelta) -> dict[str, dist.ProcessGroup]:
    sizes, names = _checked_shape(shape), list(names)
    world = dist.get_world_size()
    if math.prod(sizes) != world:
        raise ValueError(f"a {sizes} mesh has {math.prod(sizes)} ranks; this world has {world}")
    if len(names) != len(sizes) or len(set(names)) != len(names):
        raise ValueError(f"{names} are not {len(sizes)} distinct names, one per dimension")
    strides = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]
    me, mine = dist.get_rank(), {}
    for d, name in enumerate(names):
        rest = [range(s) if i != d else range(1) for i, s in enumerate(sizes)]
        for corner in itertools.product(*rest):  # the group's member with coordinate 0 in d
            start = sum(c * s for c, s in zip(corner, strides, strict=True))
            ranks = [start + i * strides[d] for i in range(sizes[d])]
            group = dist.new_group(ranks, timeout=timeout)  # every rank makes every group
            if me in ranks:
                mine[name] = group
    return mine


# --- l10_ring_attention --------------------------------------------------------------------


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None,
                   causal: bool = False) -> torch.Tensor:
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"q, k and v differ in shape: {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    size, me = dist.get_world_size(group), dist.get_rank(group)
    after = dist.get_global_rank(group, (me + 1) % size) if group else (me + 1) % size
    before = dist.get_global_rank(group, (me - 1) % size) if group else (me - 1) % size
    block, scale = q.shape[-2], q.shape[-1] ** -0.5
    below_diagonal = torch.ones(block, block, dtype=torch.bool).tril()
    total = torch.zeros_like(q)
    peak = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype)
    mass = torch.zeros_like(peak)
    travelling = torch.stack([k, v])  # K and V travel together: one message per hop
    for hop in range(size):
        owner = (me - hop) % size  # the rank whose block is here now
        if hop < size - 1:  # pass it on first, so the next rank's block arrives meanwhile
            arriving = torch.empty_like(travelling)
            requests = [dist.isend(travelling, after, group), dist.irecv(arriving, before, group)]
        if not causal or owner <= me:  # causal: blocks after this rank's are never seen
            scores = (q @ travelling[0].transpose(-2, -1)) * scale
            if causal and owner == me:
                scores = scores.masked_fill(~below_diagonal, -math.inf)
            new_peak = torch.maximum(peak, scores.amax(dim=-1, keepdim=True))
            weights = torch.exp(scores - new_peak)
            shrink = torch.exp(peak - new_peak)  # what came before, at the new maximum
            mass = mass * shrink + weights.sum(dim=-1, keepdim=True)
            total = total * shrink + weights @ travelling[1]
            peak = new_peak
        if hop < size - 1:
            for request in requests:
                request.wait()
            travelling = arriving
    return total / mass


# --- l10_moe_dispatch ----------------------------------------------------------------------


def _swap_rows(rows: torch.Tensor, send: list[int], receive: list[int], group) -> torch.Tensor:
    out = rows.new_empty((sum(receive), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), receive, send, group=group)
    return out


class _RowsToOwners(torch.autograd.Function):
    """all_to_all_single whose backward sends the gradients back the way the rows came."""

    @staticmethod
    def forward(ctx, rows, send, receive, group):
        ctx.send, ctx.receive, ctx.group = send, receive, group
        return _swap_rows(rows, send, receive, group)

    @staticmethod
    def backward(ctx, grad):
        return _swap_rows(grad, ctx.receive, ctx.send, ctx.group), None, None, None


def moe_dispatch(tokens: torch.Tensor, expert_ids: torch.Tensor, experts: Sequence[nn.Module],
                 num_experts: int, group=None) -> torch.Tensor:
    size = dist.get_world_size(group)
    if num_experts < 1 or num_experts % size:
        raise ValueError(f"{num_experts} experts cannot be shared by {size} ranks equally")
    local = num_experts // size
    if len(experts) != local:
        raise ValueError(f"{len(experts)} experts given; each of {size} ranks holds {local}")
    if expert_ids.dim() != 1 or expert_ids.dtype.is_floating_point or \
            len(expert_ids) != len(tokens):
        raise ValueError(f"expert_ids must be {len(tokens)} integer ids, one per token")
    if len(expert_ids) and not 0 <= int(expert_ids.min()) <= int(expert_ids.max()) < num_experts:
        raise ValueError(f"an expert id is outside 0..{num_experts - 1}")
    order = torch.argsort(expert_ids, stable=True)
    per_expert = torch.bincount(expert_ids, minlength=num_experts)
    arriving = torch.empty_like(per_expert)  # [source rank][my local expert] row counts
    dist.all_to_all_single(arriving, per_expert, group=group)
    send = per_expert.view(size, local).sum(dim=1).tolist()
    grid = arriving.view(size, local)
    receive = grid.sum(dim=1).tolist()
    rows = _RowsToOwners.apply(tokens[order], send, receive, group)
    # Rows came source by source, each source's sorted by expert: regroup them by expert.
    which = torch.repeat_interleave(torch.arange(local).repeat(size), grid.flatten())
    by_expert = torch.argsort(which, stable=True)
    done = torch.cat([experts[e](rows[by_expert][which[by_expert] == e]) for e in range(local)])
    results = done[torch.argsort(by_expert)]
    back = _RowsToOwners.apply(results, receive, send, group)
    return back[torch.argsort(order)]
