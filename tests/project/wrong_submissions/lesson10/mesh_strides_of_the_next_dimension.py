"""l10_mesh_groups: 4 of 8. Each dimension's stride taken as the size of the next dimension
alone, not the product of all the later ones: right for two dimensions, wrong for three
(rank 2 of a (2, 1, 2) mesh is not at (0, 0, 0) + two steps of one)."""


def mesh_coordinates(rank, shape):
    import math

    shape = tuple(shape)
    if not shape or any(not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"bad mesh shape {shape!r}")
    if not isinstance(rank, int) or not 0 <= rank < math.prod(shape):
        raise ValueError(f"rank {rank} is outside a {shape} mesh")
    strides = [shape[d + 1] if d + 1 < len(shape) else 1 for d in range(len(shape))]
    return tuple((rank // strides[d]) % shape[d] for d in range(len(shape)))


def mesh_groups(shape, names, timeout):
    import math

    import torch.distributed as dist

    shape, names = tuple(shape), list(names)
    world = dist.get_world_size()
    if math.prod(shape) != world or len(names) != len(shape) or len(set(names)) != len(names):
        raise ValueError(f"a {shape} mesh named {names} does not fit {world} ranks")
    where = [mesh_coordinates(r, shape) for r in range(world)]
    mine = {}
    for d, name in enumerate(names):
        made = set()
        for r in range(world):
            ranks = tuple(q for q in range(world)
                          if all(where[q][i] == where[r][i] for i in range(len(shape)) if i != d))
            if ranks in made:
                continue
            made.add(ranks)
            group = dist.new_group(list(ranks), timeout=timeout)
            if dist.get_rank() in ranks:
                mine[name] = group
    return mine
