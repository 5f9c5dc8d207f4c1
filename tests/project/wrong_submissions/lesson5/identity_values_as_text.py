"""l5_slurm_identity: 4 of 8. Returns the ranks and sizes as the text srun wrote ("5", not 5):
init_process_group(rank="5", ...) refuses them, and `rank == 0` is never true."""


def identity_from_slurm(environ):
    missing = [name for name in NEEDED if name not in environ]
    if missing:
        raise RuntimeError(f"not started by srun: {', '.join(missing)} not set")
    node = environ["SLURM_NODEID"]
    return {"rank": environ["SLURM_PROCID"],
            "local_rank": environ["SLURM_LOCALID"],
            "world_size": environ["SLURM_NTASKS"],
            "local_world_size": str(tasks_on_node(environ["SLURM_TASKS_PER_NODE"], int(node))),
            "node_rank": node,
            "master_addr": expand_nodelist(environ["SLURM_JOB_NODELIST"])[0]}
