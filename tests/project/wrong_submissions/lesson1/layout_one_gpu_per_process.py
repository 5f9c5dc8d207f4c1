"""l1_rank_layout: 2 of 6. gpus_per_process is ignored: always one process per GPU, so a
process spanning several GPUs never appears."""

from ddpcourse.topology import Process


def rank_layout(nodes, gpus_per_node, gpus_per_process=1):
    if min(nodes, gpus_per_node) < 1:
        raise ValueError("impossible shape")
    return [Process(n * gpus_per_node + g, n, g, (g,))
            for n in range(nodes) for g in range(gpus_per_node)]
