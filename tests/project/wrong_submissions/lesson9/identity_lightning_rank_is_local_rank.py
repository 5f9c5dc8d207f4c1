"""l9_launcher_identity: 5 of 9. Without RANK (Lightning's own launcher) the rank is taken
to be LOCAL_RANK: right on node 0, a repeat of node 0's ranks on every other node."""


def identity_from_launcher(environ, argv=(), devices_per_node=None):
    import re
    lightning = False
    if all(k in environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        rank, local, world = (int(environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        per_node = next((int(environ[k]) for k in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE")
                         if k in environ), devices_per_node)
        node = next((int(environ[k]) for k in ("GROUP_RANK", "CROSS_RANK", "NODE_RANK")
                     if k in environ), rank // per_node if per_node else 0)
    elif all(k in environ for k in ("LOCAL_RANK", "WORLD_SIZE")):
        if not devices_per_node:
            raise ValueError("devices_per_node is needed")
        rank = local = int(environ["LOCAL_RANK"])
        lightning = True
        world, node, per_node = int(environ["WORLD_SIZE"]), int(environ.get("NODE_RANK", 0)), \
            devices_per_node
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
    if not 0 <= rank < world or per_node and (not 0 <= local < per_node or world % per_node
                                              or not lightning and
                                              rank != node * per_node + local):
        raise ValueError(f"rank {rank} of {world}, local rank {local} of {per_node}: impossible")
    for i, word in enumerate(argv):
        found = re.fullmatch(r"--local_rank(?:=(\d+))?", word)
        if found and int(found.group(1) or argv[i + 1]) != local:
            raise ValueError("--local_rank is not LOCAL_RANK")
    return {"rank": rank, "local_rank": local, "node_rank": node, "world_size": world}
