"""l5_slurm_identity: 4 of 8. Every process names its own node as MASTER_ADDR (SLURMD_NODENAME):
the processes of different nodes would each wait at a different address."""


def identity_from_slurm(environ):
    missing = [name for name in NEEDED if name not in environ]
    if missing:
        raise RuntimeError(f"not started by srun: {', '.join(missing)} not set")
    node_rank = int(environ["SLURM_NODEID"])
    return {"rank": int(environ["SLURM_PROCID"]),
            "local_rank": int(environ["SLURM_LOCALID"]),
            "world_size": int(environ["SLURM_NTASKS"]),
            "local_world_size": tasks_on_node(environ["SLURM_TASKS_PER_NODE"], node_rank),
            "node_rank": node_rank,
            "master_addr": environ.get("SLURMD_NODENAME", "localhost")}
