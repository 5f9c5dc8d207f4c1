"""l4_node_groups: 3 of 7. Each process creates only its own node's group. Right on one
node; with two nodes the processes no longer create the same groups in the same order."""

import os
from datetime import timedelta

import torch.distributed as dist


def node_group(environ=None, timeout=timedelta(seconds=60)):
    env = os.environ if environ is None else environ
    per_node, node = int(env["LOCAL_WORLD_SIZE"]), int(env["GROUP_RANK"])
    return dist.new_group(list(range(node * per_node, (node + 1) * per_node)), timeout=timeout)
