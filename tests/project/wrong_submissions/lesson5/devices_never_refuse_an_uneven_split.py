"""l5_process_devices: 6 of 7. Rounds the GPUs per process down instead of refusing a node whose
GPUs do not split evenly: 6 GPUs over 4 processes gives each one GPU and leaves two idle,
silently."""


def my_devices(environ, gpus_per_node):
    per_process = gpus_per_node // int(environ["LOCAL_WORLD_SIZE"])
    return process_devices(int(environ["LOCAL_RANK"]), gpus_per_node, per_process)
