"""l1_node_groups: 2 of 4. Node n starts at n x nodes instead of n x procs_per_node: right
only when there are as many nodes as processes per node (the 2 x 2 job)."""


def node_groups(nodes, procs_per_node):
    if nodes < 1 or procs_per_node < 1:
        raise ValueError("need at least one node and one process")
    return [list(range(n * nodes, n * nodes + procs_per_node)) for n in range(nodes)]
