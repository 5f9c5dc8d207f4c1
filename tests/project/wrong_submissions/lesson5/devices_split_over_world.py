"""l5_process_devices: 3 of 7. Divides the node's GPUs by WORLD_SIZE (all nodes' processes), not
LOCAL_WORLD_SIZE: on 2 nodes of 2 processes and 8 GPUs each process claims 2 GPUs, not 4, and
6 GPUs, which split over a node's 2 processes, are refused."""


def my_devices(environ, gpus_per_node):
    processes = int(environ["WORLD_SIZE"])
    if gpus_per_node % processes:
        raise ValueError(f"{gpus_per_node} GPUs do not split over {processes} processes")
    return process_devices(int(environ["LOCAL_RANK"]), gpus_per_node, gpus_per_node // processes)
