"""l5_process_devices: 7 of 7. A right answer written another way: the node's GPUs cut into
equal slices, and the process takes the slice of its local rank."""


def process_devices(local_rank, gpus_per_node, gpus_per_process):
    if gpus_per_process <= 0 or gpus_per_node % gpus_per_process != 0:
        raise ValueError("the GPUs per process must divide the node's GPUs")
    gpus = list(range(gpus_per_node))
    slices = [gpus[i:i + gpus_per_process] for i in range(0, gpus_per_node, gpus_per_process)]
    if local_rank < 0 or local_rank >= len(slices):
        raise ValueError(f"no process with local rank {local_rank} on this node")
    return slices[local_rank]
