"""l10_mesh_groups: 8 of 8. Right, written another way: each dimension's groups from
dist.new_subgroups_by_enumeration, which makes every group on every rank, with the timeout."""


def mesh_groups(shape, names, timeout):
    import math

    import torch
    import torch.distributed as dist

    shape, names = tuple(shape), list(names)
    world = dist.get_world_size()
    if math.prod(shape) != world:
        raise ValueError(f"a {shape} mesh has {math.prod(shape)} ranks, not {world}")
    if len(names) != len(shape) or len(set(names)) != len(names):
        raise ValueError(f"{names}: one distinct name per dimension")
    grid = torch.arange(world).reshape(shape)
    mine = {}
    for d, name in enumerate(names):
        lines = grid.movedim(d, -1).reshape(-1, shape[d]).tolist()
        group, _ = dist.new_subgroups_by_enumeration(lines, timeout=timeout)
        mine[name] = group
    return mine
