"""l5_process_devices: 6 of 7. Never checks the local rank: local rank 2 of a node whose 4 GPUs
make 2 processes gets GPUs 4 and 5, which the node does not have."""


def process_devices(local_rank, gpus_per_node, gpus_per_process):
    if gpus_per_process < 1 or gpus_per_node % gpus_per_process:
        raise ValueError(f"{gpus_per_process} GPUs per process do not divide {gpus_per_node}")
    return [local_rank * gpus_per_process + i for i in range(gpus_per_process)]
