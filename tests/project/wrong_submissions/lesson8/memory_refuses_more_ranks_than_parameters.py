"""l8_memory_calculator: 8 of 9. More ranks than parameters refused.

"Nothing to shard over 8 ranks with 3 parameters": but padding makes it work, one
parameter (or padding) per rank, and the numbers are still the ones a rank holds.
"""


def bytes_per_rank(num_params, world_size, strategy, optimizer="adam", mixed_precision=False):
    if num_params < 1 or world_size < 1 or world_size > num_params:
        raise ValueError(f"cannot shard {num_params} parameters over {world_size} ranks")
    if strategy not in SHARDED or optimizer not in BUFFERS:
        raise ValueError(f"unknown strategy {strategy!r} or optimizer {optimizer!r}")
    if mixed_precision:
        per_param = {"params": 2, "grads": 2, "optimizer": 4 + 4 * BUFFERS[optimizer]}
    else:
        per_param = {"params": 4, "grads": 4, "optimizer": 4 * BUFFERS[optimizer]}
    shard = -(-num_params // world_size)
    held = {term: per_param[term] * (shard if term in SHARDED[strategy] else num_params)
            for term in ("params", "grads", "optimizer")}
    held["total"] = sum(held.values())
    return held
