"""l3_batch_and_lr: 2 of 4. The global batch is split by rounding down, so 256 over 3
processes gives 85 each and one sample of every global batch is silently lost (and a
global batch smaller than the world gives 0)."""


def per_process_batch(global_batch, world_size):
    if world_size < 1 or global_batch < 1:
        raise ValueError("need at least one process and one sample")
    return global_batch // world_size
