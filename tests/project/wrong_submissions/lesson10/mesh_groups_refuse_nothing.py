"""l10_mesh_groups: 7 of 8. No check of the shape against the world or of the names: a shape
of W + 1 ranks is left to dist.new_group, and two names for one dimension fail in the middle
with an IndexError, or quietly drop a name."""


def mesh_groups(shape, names, timeout):
    import itertools
    import math

    import torch.distributed as dist

    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    mine = {}
    for d, name in enumerate(names):
        others = [range(s) if i != d else [0] for i, s in enumerate(shape)]
        for corner in itertools.product(*others):
            first = sum(c * s for c, s in zip(corner, strides, strict=False))
            ranks = [first + i * strides[d] for i in range(shape[d])]
            group = dist.new_group(ranks, timeout=timeout)
            if dist.get_rank() in ranks:
                mine[name] = group
    return mine
