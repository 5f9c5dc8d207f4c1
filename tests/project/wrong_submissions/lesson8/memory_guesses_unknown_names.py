"""l8_memory_calculator: 8 of 9. Unknown strategies and optimizers are guessed, not refused.

The numbers are checked, but a misspelt strategy counts as "ddp" and an unknown optimizer
as Adam: a typo gives a plausible table instead of an error.
"""


def bytes_per_rank(num_params, world_size, strategy, optimizer="adam", mixed_precision=False):
    if num_params < 1 or world_size < 1:
        raise ValueError(f"need num_params >= 1 and world_size >= 1, got {num_params} and "
                         f"{world_size}")
    buffers = BUFFERS.get(optimizer, 2)
    sharded = SHARDED.get(strategy, ())
    if mixed_precision:
        per_param = {"params": 2, "grads": 2, "optimizer": 4 + 4 * buffers}
    else:
        per_param = {"params": 4, "grads": 4, "optimizer": 4 * buffers}
    shard = -(-num_params // world_size)
    held = {term: per_param[term] * (shard if term in sharded else num_params)
            for term in ("params", "grads", "optimizer")}
    held["total"] = sum(held.values())
    return held
