"""l8_memory_calculator: 0 of 9. The course's own per-parameter table (ddpcourse.sharding's
bytes_per_parameter, refused while grading) kept in a default argument, where no name of the
module holds it: the sharding arithmetic is the submission's, the bytes per parameter the
course's. Refused however it is held: every call raises."""

import ddpcourse.sharding as _course


def bytes_per_rank(num_params, world_size, strategy, optimizer="adam", mixed_precision=False,
                   _per_parameter=_course.bytes_per_parameter):
    per = _per_parameter("mixed" if mixed_precision else "fp32", optimizer)
    if num_params < 1 or world_size < 1:
        raise ValueError(f"need num_params >= 1 and world_size >= 1, got {num_params} and "
                         f"{world_size}")
    if strategy not in SHARDED:
        raise ValueError(f"unknown strategy {strategy!r}")
    shard = -(-num_params // world_size)
    held = {term: per[term] * (shard if term in SHARDED[strategy] else num_params)
            for term in ("params", "grads", "optimizer")}
    held["total"] = sum(held.values())
    return held
