"""l9_launcher_identity: 7 of 9. SLURM's variables are read first: under torchrun started by
srun, SLURM_PROCID numbers the nodes' torchrun tasks, and every rank of a node gets its
node's number."""


def identity_from_launcher(environ, argv=(), devices_per_node=None):
    import re
    if "SLURM_PROCID" in environ:
        rank, local, world, node = (int(environ[k]) for k in (
            "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID"))
        per_node = None
    elif all(k in environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
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
        per_node, rank = devices_per_node, node * devices_per_node + local
    elif "OMPI_COMM_WORLD_RANK" in environ:
        rank, local, world, per_node = (int(environ[f"OMPI_COMM_WORLD_{k}"]) for k in
                                        ("RANK", "LOCAL_RANK", "SIZE", "LOCAL_SIZE"))
        node = rank // per_node
    else:
        raise ValueError("not started by a launcher")
    if not 0 <= rank < world or per_node and (
            not 0 <= local < per_node or world % per_node or rank != node * per_node + local):
        raise ValueError(f"rank {rank} of {world}, node {node} x {per_node} + {local}: impossible")
    for i, word in enumerate(argv):
        found = re.fullmatch(r"--local_rank(?:=(\d+))?", word)
        if found and int(found.group(1) or argv[i + 1]) != local:
            raise ValueError("--local_rank is not LOCAL_RANK")
    return {"rank": rank, "local_rank": local, "node_rank": node, "world_size": world}
