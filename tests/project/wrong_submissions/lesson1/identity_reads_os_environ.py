"""l1_identity: 1 of 6. Reads os.environ instead of the mapping it is given: right inside a
torchrun job, wrong for any other environment handed to it, the grader's own first call
included (so the job is not even started for it)."""

import os


def identity_from_env(environ):
    environ = os.environ
    missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if k not in environ]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not set: start this with torchrun")
    rank = int(environ["RANK"])
    world_size = int(environ["WORLD_SIZE"])
    local_world_size = int(environ.get("LOCAL_WORLD_SIZE", world_size))
    node = environ.get("GROUP_RANK", environ.get("NODE_RANK"))
    return {"rank": rank, "local_rank": int(environ["LOCAL_RANK"]), "world_size": world_size,
            "local_world_size": local_world_size,
            "node_rank": int(node) if node is not None else rank // local_world_size}
