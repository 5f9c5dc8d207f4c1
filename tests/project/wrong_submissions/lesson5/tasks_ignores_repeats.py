"""l5_slurm_identity: 1 of 8. Reads "2(x3),1" as two nodes (the repeat count dropped), so the
third and fourth nodes are not found and no identity on that job comes out."""

import re


def tasks_on_node(tasks_per_node, node_id):
    counts = [int(re.match(r"\s*(\d+)", part).group(1)) for part in tasks_per_node.split(",")]
    if not 0 <= node_id < len(counts):
        raise ValueError(f"node {node_id} is not listed")
    return counts[node_id]
