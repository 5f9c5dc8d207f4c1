"""l1_node_groups: 1 of 4. Ranks dealt out round-robin (rank % nodes): groups of the right
size, but node 0's group holds ranks 0 and 2 when node 0 runs ranks 0 and 1."""


def node_groups(nodes, procs_per_node):
    if nodes < 1 or procs_per_node < 1:
        raise ValueError("need at least one node and one process")
    return [list(range(n, nodes * procs_per_node, nodes)) for n in range(nodes)]
