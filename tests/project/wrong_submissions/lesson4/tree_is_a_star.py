"""l4_broadcast_tree: 4 of 9. A star: the root sends the tensor to every other rank itself.
The right result from send/recv, but the root sends W-1 messages, one after another."""

import torch.distributed as dist


def tree_broadcast(tensor, src):
    rank, world = dist.get_rank(), dist.get_world_size()
    if not 0 <= src < world:
        raise ValueError("no such rank")
    if rank == src:
        for other in range(world):
            if other != src:
                dist.send(tensor, dst=other)
    else:
        dist.recv(tensor, src=src)
