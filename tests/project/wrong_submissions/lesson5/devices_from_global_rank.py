"""l5_process_devices: 3 of 7. Uses the global RANK where the local rank belongs: right on node
0, but on node 1 rank 2 asks for GPUs 6-8 of a 6-GPU node."""


def my_devices(environ, gpus_per_node):
    processes = int(environ["LOCAL_WORLD_SIZE"])
    if gpus_per_node % processes:
        raise ValueError(f"{gpus_per_node} GPUs do not split over {processes} processes")
    return process_devices(int(environ["RANK"]), gpus_per_node, gpus_per_node // processes)
