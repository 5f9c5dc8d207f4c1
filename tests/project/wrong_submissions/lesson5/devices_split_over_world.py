"""l5_process_devices: 2 of 5. Divides the node's GPUs by WORLD_SIZE (all nodes' processes), not
LOCAL_WORLD_SIZE: with 2 nodes each process claims one GPU and half the GPUs sit idle."""


def my_devices(environ, gpus_per_node):
    processes = int(environ["WORLD_SIZE"])
    return process_devices(int(environ["LOCAL_RANK"]), gpus_per_node, gpus_per_node // processes)
