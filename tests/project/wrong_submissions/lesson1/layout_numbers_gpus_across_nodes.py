"""l1_rank_layout: 1 of 6. GPUs numbered across the whole job (node 1's are 4..7) where a
process names the GPUs of its own node (0..3 on every node)."""

from ddpcourse.topology import Process


def rank_layout(nodes, gpus_per_node, gpus_per_process=1):
    if min(nodes, gpus_per_node, gpus_per_process) < 1 or gpus_per_node % gpus_per_process:
        raise ValueError("impossible shape")
    per_node = gpus_per_node // gpus_per_process
    return [Process(n * per_node + p, n, p,
                    tuple(range(n * gpus_per_node + p * gpus_per_process,
                                n * gpus_per_node + (p + 1) * gpus_per_process)))
            for n in range(nodes) for p in range(per_node)]
