"""l1_global_rank: 1 of 4. Off by one: ranks counted from 1 (node_rank x procs_per_node +
local_rank + 1). The reference's rank_layout, which calls global_rank, is graded beside it
with the grader's own global_rank and keeps its full marks: one mistake, one exercise."""


def global_rank(node_rank, local_rank, procs_per_node):
    if procs_per_node < 1 or node_rank < 0 or not 0 <= local_rank < procs_per_node:
        raise ValueError("no such process")
    return node_rank * procs_per_node + local_rank + 1
