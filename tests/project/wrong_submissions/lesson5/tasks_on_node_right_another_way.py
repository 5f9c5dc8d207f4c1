"""l5_slurm_identity: 8 of 8. A right answer written another way: tasks_on_node walks the text
once with one pattern and counts nodes down instead of building the list."""

import re

PART = re.compile(r"(\d+)(\(x(\d+)\))?(,|$)")


def tasks_on_node(tasks_per_node, node_id):
    position, answer, left = 0, None, node_id
    while position < len(tasks_per_node) or position == 0:
        m = PART.match(tasks_per_node, position)
        if not m or m.end() == position:
            raise ValueError(f"SLURM_TASKS_PER_NODE={tasks_per_node!r} is malformed")
        nodes = int(m.group(3) or 1)
        if answer is None and 0 <= left < nodes:
            answer = int(m.group(1))
        left -= nodes
        position = m.end()
        if m.group(4) == "," and position == len(tasks_per_node):
            raise ValueError(f"SLURM_TASKS_PER_NODE={tasks_per_node!r} ends with a comma")
    if answer is None:
        raise ValueError(f"node {node_id} is not among the nodes of {tasks_per_node!r}")
    return answer
