"""l5_process_devices: 1 of 7. Deals the GPUs out round-robin (local rank 0 gets 0 and 2), so a
process's GPUs are not neighbours and the layout differs from lesson 1's."""


def process_devices(local_rank, gpus_per_node, gpus_per_process):
    if gpus_per_process < 1 or gpus_per_node % gpus_per_process:
        raise ValueError("GPUs do not split")
    processes = gpus_per_node // gpus_per_process
    if not 0 <= local_rank < processes:
        raise ValueError("no such local rank")
    return [local_rank + i * processes for i in range(gpus_per_process)]
