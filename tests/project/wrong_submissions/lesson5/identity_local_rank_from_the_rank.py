"""l5_slurm_identity: 4 of 8. Works out the local and node rank from the global rank, as if every
node ran the same number of tasks and srun handed ranks out node by node: wrong on nodes that
run 3, 1, 2, 2 tasks, and wrong on every node under --distribution=cyclic."""


def identity_from_slurm(environ):
    missing = [name for name in NEEDED if name not in environ]
    if missing:
        raise RuntimeError(f"not started by srun: {', '.join(missing)} not set")
    rank = int(environ["SLURM_PROCID"])
    per_node = tasks_on_node(environ["SLURM_TASKS_PER_NODE"], int(environ["SLURM_NODEID"]))
    return {"rank": rank,
            "local_rank": rank % per_node,
            "world_size": int(environ["SLURM_NTASKS"]),
            "local_world_size": per_node,
            "node_rank": rank // per_node,
            "master_addr": expand_nodelist(environ["SLURM_JOB_NODELIST"])[0]}
