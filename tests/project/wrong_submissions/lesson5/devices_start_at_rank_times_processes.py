"""l5_process_devices: 1 of 7. Starts local rank r at GPU r x (processes per node) instead of
r x (GPUs per process): right only where the two are equal, so with 6 GPUs at 3 per process
local rank 1 claims GPUs 2-4, two of them its neighbour's."""


def process_devices(local_rank, gpus_per_node, gpus_per_process):
    if gpus_per_process < 1 or gpus_per_node % gpus_per_process:
        raise ValueError(f"{gpus_per_process} GPUs per process do not divide {gpus_per_node}")
    processes = gpus_per_node // gpus_per_process
    if not 0 <= local_rank < processes:
        raise ValueError(f"local rank {local_rank}: a node runs processes 0..{processes - 1}")
    first = local_rank * processes
    return list(range(first, first + gpus_per_process))
