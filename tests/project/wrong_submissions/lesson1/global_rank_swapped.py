"""l1_global_rank: 1 of 4. The roles swapped: local_rank x procs_per_node + node_rank, so
node 1's first process gets rank 1 instead of procs_per_node."""


def global_rank(node_rank, local_rank, procs_per_node):
    if procs_per_node < 1 or node_rank < 0 or not 0 <= local_rank < procs_per_node:
        raise ValueError("no such process")
    return local_rank * procs_per_node + node_rank
