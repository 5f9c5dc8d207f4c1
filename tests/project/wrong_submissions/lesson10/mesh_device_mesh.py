"""l10_mesh_groups: 7 of 8. torch's init_device_mesh makes the right groups, but it takes no
timeout: each new group waits gloo's 30 minutes (unless given backend options), and a
dimension over every rank reuses the world's group (on a machine without CUDA), with the
world's timeout: never the one asked for."""


def mesh_groups(shape, names, timeout):
    import math

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    shape, names = tuple(shape), tuple(names)
    if math.prod(shape) != dist.get_world_size():
        raise ValueError(f"a {shape} mesh does not fit {dist.get_world_size()} ranks")
    if len(names) != len(shape) or len(set(names)) != len(names):
        raise ValueError(f"{names}: one distinct name per dimension")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    return {name: mesh.get_group(name) for name in names}
