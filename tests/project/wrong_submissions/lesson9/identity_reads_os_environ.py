"""l9_launcher_identity: 0 of 9. The process's own os.environ is read instead of the
variables handed in: it works inside a job, and nowhere else (nor in the grader)."""


def identity_from_launcher(environ, argv=(), devices_per_node=None):
    import os
    try:
        return {"rank": int(os.environ["RANK"]), "local_rank": int(os.environ["LOCAL_RANK"]),
                "node_rank": int(os.environ.get("GROUP_RANK", 0)),
                "world_size": int(os.environ["WORLD_SIZE"])}
    except KeyError as missing:
        raise ValueError(f"{missing} is not set") from None
