"""l5_process_devices: 2 of 5. Uses the global RANK where the local rank belongs: right on node
0, but on node 1 rank 2 asks for GPUs 4 and 5 of a 4-GPU node."""


def my_devices(environ, gpus_per_node):
    processes = int(environ["LOCAL_WORLD_SIZE"])
    return process_devices(int(environ["RANK"]), gpus_per_node, gpus_per_node // processes)
