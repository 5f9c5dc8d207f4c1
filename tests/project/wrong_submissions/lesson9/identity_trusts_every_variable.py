"""l9_launcher_identity: 7 of 9. Each launcher's variables read right, and believed: an
impossible set (a rank outside the world, a rank that is not node x per node + local) is
returned as if it were a process."""


def identity_from_launcher(environ, argv=(), devices_per_node=None):
    if all(k in environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        rank, local, world = (int(environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        per_node = next((int(environ[k]) for k in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE")
                         if k in environ), devices_per_node)
        node = next((int(environ[k]) for k in ("GROUP_RANK", "CROSS_RANK", "NODE_RANK")
                     if k in environ), rank // per_node if per_node else 0)
    elif all(k in environ for k in ("LOCAL_RANK", "WORLD_SIZE")):
        if not devices_per_node:
            raise ValueError("devices_per_node is needed")
        local, world, node = (int(environ.get(k, 0)) for k in
                              ("LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"))
        rank = node * devices_per_node + local
    elif "OMPI_COMM_WORLD_RANK" in environ:
        rank, local, world, per_node = (int(environ[f"OMPI_COMM_WORLD_{k}"]) for k in
                                        ("RANK", "LOCAL_RANK", "SIZE", "LOCAL_SIZE"))
        node = rank // per_node
    elif "SLURM_PROCID" in environ:
        rank, local, world, node = (int(environ[k]) for k in (
            "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID"))
    else:
        raise ValueError("not started by a launcher")
    for i, word in enumerate(argv):
        if word.startswith("--local_rank"):
            value = word.partition("=")[2] or argv[i + 1]
            if int(value) != local:
                raise ValueError("--local_rank is not LOCAL_RANK")
    return {"rank": rank, "local_rank": local, "node_rank": node, "world_size": world}
