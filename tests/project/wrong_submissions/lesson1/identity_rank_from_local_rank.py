"""l1_identity: 1 of 6. The rank is read from LOCAL_RANK: right on one node, repeated on
every other node."""


def identity_from_env(environ):
    missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if k not in environ]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not set: start this with torchrun")
    local_rank = int(environ["LOCAL_RANK"])
    world_size = int(environ["WORLD_SIZE"])
    local_world_size = int(environ.get("LOCAL_WORLD_SIZE", world_size))
    node = environ.get("GROUP_RANK", environ.get("NODE_RANK"))
    return {"rank": local_rank, "local_rank": local_rank, "world_size": world_size,
            "local_world_size": local_world_size,
            "node_rank": int(node) if node is not None else local_rank // local_world_size}
