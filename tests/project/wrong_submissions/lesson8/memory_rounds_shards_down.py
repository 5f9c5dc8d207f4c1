"""l8_memory_calculator: 8 of 9. A shard of N parameters over W ranks taken as N // W.

Right whenever W divides N (the paper's example, 7 B on 8 GPUs), but the real
implementations pad the flat parameters to a multiple of W: 10 parameters on 4 ranks are
3 per rank, not 2.
"""


def bytes_per_rank(num_params, world_size, strategy, optimizer="adam", mixed_precision=False):
    if num_params < 1 or world_size < 1:
        raise ValueError(f"need num_params >= 1 and world_size >= 1, got {num_params} and "
                         f"{world_size}")
    if strategy not in SHARDED or optimizer not in BUFFERS:
        raise ValueError(f"unknown strategy {strategy!r} or optimizer {optimizer!r}")
    if mixed_precision:
        per_param = {"params": 2, "grads": 2, "optimizer": 4 + 4 * BUFFERS[optimizer]}
    else:
        per_param = {"params": 4, "grads": 4, "optimizer": 4 * BUFFERS[optimizer]}
    shard = num_params // world_size
    held = {term: per_param[term] * (shard if term in SHARDED[strategy] else num_params)
            for term in ("params", "grads", "optimizer")}
    held["total"] = sum(held.values())
    return held
