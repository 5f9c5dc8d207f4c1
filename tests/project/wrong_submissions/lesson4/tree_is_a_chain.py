"""l4_broadcast_tree: 4 of 9. A chain: each rank receives from the one before it and sends
to the one after. The right result from send/recv, but W-1 rounds instead of log2 W: at
W = 4 the last rank is 3 hops from the root."""

import torch.distributed as dist


def tree_broadcast(tensor, src):
    rank, world = dist.get_rank(), dist.get_world_size()
    if not 0 <= src < world:
        raise ValueError("no such rank")
    if rank != src:
        dist.recv(tensor, src=(rank - 1) % world)
    if (rank + 1) % world != src:
        dist.send(tensor, dst=(rank + 1) % world)
