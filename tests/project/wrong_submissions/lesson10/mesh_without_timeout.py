"""l10_mesh_groups: 7 of 8. The right groups, made without the timeout: dist.new_group then
waits gloo's 30 minutes for a rank that never comes, whatever init_process_group was told."""


def mesh_groups(shape, names, timeout):
    import itertools
    import math

    import torch.distributed as dist

    shape, names = tuple(shape), list(names)
    world = dist.get_world_size()
    if math.prod(shape) != world:
        raise ValueError(f"a {shape} mesh has {math.prod(shape)} ranks, not {world}")
    if len(names) != len(shape) or len(set(names)) != len(names):
        raise ValueError(f"{names}: one distinct name per dimension")
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    mine = {}
    for d, name in enumerate(names):
        others = [range(s) if i != d else [0] for i, s in enumerate(shape)]
        for corner in itertools.product(*others):
            first = sum(c * s for c, s in zip(corner, strides, strict=False))
            ranks = [first + i * strides[d] for i in range(shape[d])]
            group = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                mine[name] = group
    return mine
