"""l9_launcher_identity: 8 of 9. DeepSpeed's --local_rank argument is never read: a script
started with another local rank than its environment's runs on as if nothing were wrong."""


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
        per_node, rank = devices_per_node, node * devices_per_node + local
    elif "OMPI_COMM_WORLD_RANK" in environ:
        rank, local, world, per_node = (int(environ[f"OMPI_COMM_WORLD_{k}"]) for k in
                                        ("RANK", "LOCAL_RANK", "SIZE", "LOCAL_SIZE"))
        node = rank // per_node
    elif "SLURM_PROCID" in environ:
        rank, local, world, node = (int(environ[k]) for k in (
            "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID"))
        per_node = None
    else:
        raise ValueError("not started by a launcher")
    if not 0 <= rank < world or per_node and (
            not 0 <= local < per_node or world % per_node or rank != node * per_node + local):
        raise ValueError(f"rank {rank} of {world}, node {node} x {per_node} + {local}: impossible")
    return {"rank": rank, "local_rank": local, "node_rank": node, "world_size": world}
