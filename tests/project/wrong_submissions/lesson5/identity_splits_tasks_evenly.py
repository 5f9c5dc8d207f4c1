"""l5_slurm_identity: 4 of 8. Takes the tasks per node as SLURM_NTASKS / SLURM_NNODES, which
is wrong whenever the nodes run different numbers of tasks ("2(x3),1")."""


def identity_from_slurm(environ):
    missing = [name for name in NEEDED if name not in environ]
    if missing:
        raise RuntimeError(f"not started by srun: {', '.join(missing)} not set")
    return {"rank": int(environ["SLURM_PROCID"]),
            "local_rank": int(environ["SLURM_LOCALID"]),
            "world_size": int(environ["SLURM_NTASKS"]),
            "local_world_size": int(environ["SLURM_NTASKS"]) // int(environ["SLURM_NNODES"]),
            "node_rank": int(environ["SLURM_NODEID"]),
            "master_addr": expand_nodelist(environ["SLURM_JOB_NODELIST"])[0]}
