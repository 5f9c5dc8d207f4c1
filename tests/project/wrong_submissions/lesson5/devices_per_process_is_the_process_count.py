"""l5_process_devices: 3 of 7. Gives each process LOCAL_WORLD_SIZE GPUs, mixing up the processes
per node with the GPUs per process: right only where the two are equal (4 GPUs, 2 processes),
so with 6 GPUs over 2 processes each takes 2 and GPUs 4 and 5 sit idle."""


def my_devices(environ, gpus_per_node):
    processes = int(environ["LOCAL_WORLD_SIZE"])
    return process_devices(int(environ["LOCAL_RANK"]), gpus_per_node, processes)
