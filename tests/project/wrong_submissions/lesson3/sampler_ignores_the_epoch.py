"""l3_sampler_indices: 2 of 6. The shuffle is seeded with seed alone, not seed + epoch:
every epoch reads the same order (what forgetting set_epoch does)."""

import math

import torch


def sampler_indices(length, world_size, rank, shuffle=True, seed=0, epoch=0, drop_last=False):
    if world_size < 1 or length < 0 or not 0 <= rank < world_size:
        raise ValueError("impossible arguments")
    if shuffle:
        order = torch.randperm(length, generator=torch.Generator().manual_seed(seed)).tolist()
    else:
        order = list(range(length))
    if drop_last and length % world_size:
        per_rank = math.ceil((length - world_size) / world_size)
    else:
        per_rank = math.ceil(length / world_size)
    total = per_rank * world_size
    order = order[:total] if drop_last else (order * math.ceil(total / max(length, 1)))[:total]
    return order[rank:total:world_size]
