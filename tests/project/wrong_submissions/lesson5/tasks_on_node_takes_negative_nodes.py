"""l5_slurm_identity: 7 of 8. Checks only the upper end of node_id, so node -1 is Python's last
node, not a ValueError: a node id read wrongly passes unnoticed."""

import re


def tasks_on_node(tasks_per_node, node_id):
    counts = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not m:
            raise ValueError(f"cannot read {part!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if node_id >= len(counts):
        raise ValueError(f"node {node_id} is not listed")
    return counts[node_id]
