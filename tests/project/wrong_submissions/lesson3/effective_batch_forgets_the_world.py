"""l3_batch_and_lr: 2 of 4. The effective batch counts one process's samples only
(per_process x accumulation_steps), so the learning rate scaled with it is W times too
small."""


def effective_batch(per_process, world_size, accumulation_steps=1):
    if min(per_process, world_size, accumulation_steps) < 1:
        raise ValueError("every count must be at least 1")
    return per_process * accumulation_steps
