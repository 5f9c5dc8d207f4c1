"""l3_sampler_indices: 1 of 6. Rank r takes a contiguous block of the order instead of
every W-th index from position r: still disjoint shares of equal size that cover the
dataset, but not the ones DistributedSampler hands out."""

import math

import torch


def sampler_indices(length, world_size, rank, shuffle=True, seed=0, epoch=0, drop_last=False):
    if world_size < 1 or length < 0 or not 0 <= rank < world_size:
        raise ValueError("impossible arguments")
    if shuffle:
        order = torch.randperm(length, generator=torch.Generator().manual_seed(seed + epoch))
        order = order.tolist()
    else:
        order = list(range(length))
    if drop_last and length % world_size:
        per_rank = math.ceil((length - world_size) / world_size)
    else:
        per_rank = math.ceil(length / world_size)
    total = per_rank * world_size
    order = order[:total] if drop_last else (order * math.ceil(total / max(length, 1)))[:total]
    return order[rank * per_rank:(rank + 1) * per_rank]
