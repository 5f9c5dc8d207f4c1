"""l4_broadcast_tree: 1 of 9. The process group's own broadcast method, reached without
dist.broadcast. Only the one-process case earns a point."""

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_group


def tree_broadcast(tensor, src):
    if not 0 <= src < dist.get_world_size():
        raise ValueError("no such rank")
    _get_default_group().broadcast(tensor, src).wait()
