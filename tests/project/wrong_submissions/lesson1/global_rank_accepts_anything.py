"""l1_global_rank: 3 of 4. The right formula, but impossible ranks (a local rank past the
node's processes, negative ranks) are answered instead of refused."""


def global_rank(node_rank, local_rank, procs_per_node):
    return node_rank * procs_per_node + local_rank
