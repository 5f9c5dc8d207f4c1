"""l9_launcher_identity: 9 of 9. Right, written another way: one table of the launchers'
variable names, tried in order, and the checks done once for all."""

LAUNCHERS = [  # (rank, local rank, world, processes per node, node rank), innermost first
    ("RANK", "LOCAL_RANK", "WORLD_SIZE", ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"),
     ("GROUP_RANK", "CROSS_RANK", "NODE_RANK")),
    (None, "LOCAL_RANK", "WORLD_SIZE", (), ("NODE_RANK",)),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
     ("OMPI_COMM_WORLD_LOCAL_SIZE",), ()),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", (), ("SLURM_NODEID",)),
]


def identity_from_launcher(environ, argv=(), devices_per_node=None):
    def number(name):
        if not environ[name].strip().isdigit():
            raise ValueError(f"{name}={environ[name]!r}: not a number")
        return int(environ[name])

    found = [names for names in LAUNCHERS if all(n in environ for n in names[:3] if n)]
    if not found:
        raise ValueError("no launcher set this process's variables")
    rank_name, local_name, world_name, size_names, node_names = found[0]
    local, world = number(local_name), number(world_name)
    per_node = next((number(n) for n in size_names if n in environ), devices_per_node)
    node_name = next((n for n in node_names if n in environ), None)
    if rank_name is None:
        if not per_node:
            raise ValueError("without RANK, the devices per node are needed")
        node = number(node_name) if node_name else 0
        rank = node * per_node + local
    else:
        rank = number(rank_name)
        node = number(node_name) if node_name else (rank // per_node if per_node else 0)
    problems = []
    if not 0 <= rank < world:
        problems.append(f"rank {rank} outside a world of {world}")
    if per_node and not 0 <= local < per_node:
        problems.append(f"local rank {local} outside {per_node} per node")
    if per_node and (world % per_node or rank != node * per_node + local):
        problems.append(f"rank {rank} is not node {node} x {per_node} + {local} in {world}")
    text = " ".join(argv)
    for token in text.replace("=", " ").split("--local_rank ")[1:]:
        if token.split()[0] != str(local):
            problems.append(f"--local_rank {token.split()[0]} but LOCAL_RANK {local}")
    if problems:
        raise ValueError("; ".join(problems))
    return {"rank": rank, "local_rank": local, "node_rank": node, "world_size": world}
