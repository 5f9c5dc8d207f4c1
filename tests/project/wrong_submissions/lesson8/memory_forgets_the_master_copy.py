"""l8_memory_calculator: 3 of 9. Mixed precision without the fp32 master weights.

Adam in mixed precision counted as 2 + 2 + 8 bytes per parameter: the two fp32 moments,
but not the fp32 copy of the weights the optimizer updates (the bf16 weights are only a
rounded copy of it). The ZeRO paper's 16 bytes per parameter become 12.
"""


def bytes_per_rank(num_params, world_size, strategy, optimizer="adam", mixed_precision=False):
    if num_params < 1 or world_size < 1:
        raise ValueError(f"need num_params >= 1 and world_size >= 1, got {num_params} and "
                         f"{world_size}")
    if strategy not in SHARDED or optimizer not in BUFFERS:
        raise ValueError(f"unknown strategy {strategy!r} or optimizer {optimizer!r}")
    width = 2 if mixed_precision else 4
    per_param = {"params": width, "grads": width, "optimizer": 4 * BUFFERS[optimizer]}
    shard = -(-num_params // world_size)
    held = {term: per_param[term] * (shard if term in SHARDED[strategy] else num_params)
            for term in ("params", "grads", "optimizer")}
    held["total"] = sum(held.values())
    return held
