"""l5_slurm_identity: 7 of 8. Turns the first KeyError into the RuntimeError, so the message names
one missing variable when several are missing: the student fixes one, runs again, finds the
next."""


def identity_from_slurm(environ):
    try:
        node_rank = int(environ["SLURM_NODEID"])
        return {"rank": int(environ["SLURM_PROCID"]),
                "local_rank": int(environ["SLURM_LOCALID"]),
                "world_size": int(environ["SLURM_NTASKS"]),
                "local_world_size": tasks_on_node(environ["SLURM_TASKS_PER_NODE"], node_rank),
                "node_rank": node_rank,
                "master_addr": expand_nodelist(environ["SLURM_JOB_NODELIST"])[0]}
    except KeyError as missing:
        raise RuntimeError(f"not started by srun: {missing} is not set") from None
