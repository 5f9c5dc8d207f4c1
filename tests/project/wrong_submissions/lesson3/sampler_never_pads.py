"""l3_sampler_indices: 1 of 6. No padding: the tail that does not fill a round is always
dropped (as if drop_last were always set), so an uneven dataset loses samples."""

import torch


def sampler_indices(length, world_size, rank, shuffle=True, seed=0, epoch=0, drop_last=False):
    if world_size < 1 or length < 0 or not 0 <= rank < world_size:
        raise ValueError("impossible arguments")
    if shuffle:
        order = torch.randperm(length, generator=torch.Generator().manual_seed(seed + epoch))
        order = order.tolist()
    else:
        order = list(range(length))
    total = length // world_size * world_size
    return order[rank:total:world_size]
