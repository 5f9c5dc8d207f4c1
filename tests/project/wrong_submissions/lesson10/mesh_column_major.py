"""l10_mesh_groups: 3 of 8. The ranks written column-major (the first dimension changes
fastest, as in Fortran): rank 1 of a (2, 2) mesh at (1, 0), so its "tp" group is a column.
Meshes with one dimension above 1 come out the same, which is all W = 3 tries."""


def mesh_coordinates(rank, shape):
    import math

    shape = tuple(shape)
    if not shape or any(not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"bad mesh shape {shape!r}")
    if not isinstance(rank, int) or not 0 <= rank < math.prod(shape):
        raise ValueError(f"rank {rank} is outside a {shape} mesh")
    coordinates = []
    for size in shape:
        coordinates.append(rank % size)
        rank //= size
    return tuple(coordinates)


def mesh_groups(shape, names, timeout):
    import math

    import torch.distributed as dist

    shape, names = tuple(shape), list(names)
    world = dist.get_world_size()
    if math.prod(shape) != world or len(names) != len(shape) or len(set(names)) != len(names):
        raise ValueError(f"a {shape} mesh named {names} does not fit {world} ranks")
    everyone = [mesh_coordinates(r, shape) for r in range(world)]
    mine = {}
    for d, name in enumerate(names):
        seen = []
        for r in range(world):
            key = everyone[r][:d] + everyone[r][d + 1:]
            if key in seen:
                continue
            seen.append(key)
            ranks = [q for q in range(world) if everyone[q][:d] + everyone[q][d + 1:] == key]
            group = dist.new_group(ranks, timeout=timeout)
            if dist.get_rank() in ranks:
                mine[name] = group
    return mine
