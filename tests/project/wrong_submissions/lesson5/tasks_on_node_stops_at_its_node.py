"""l5_slurm_identity: 7 of 8. Stops reading at node_id's part, so a malformed part after it goes
unnoticed ("2,x" for node 0 gives 2) where the docstring asks for a ValueError."""

import re


def tasks_on_node(tasks_per_node, node_id):
    if node_id < 0:
        raise ValueError(f"node {node_id} is not listed")
    first = 0  # the first node of the part being read
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not m:
            raise ValueError(f"cannot read {part!r}")
        first += int(m.group(2) or 1)
        if node_id < first:
            return int(m.group(1))
    raise ValueError(f"node {node_id} is not listed")
