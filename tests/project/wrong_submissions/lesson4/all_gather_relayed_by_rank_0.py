"""l4_all_gather: 4 of 10. Every rank sends its tensor to rank 0, which sends every tensor
on to every rank. The right lists, from send/recv, but rank 0 sends (W-1)^2 tensors where
an all-gather costs each rank W-1."""

import torch.distributed as dist


def all_gather_p2p(tensor_list, tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    if len(tensor_list) != world:
        raise ValueError(f"need one tensor per rank ({world})")
    tensor_list[rank].copy_(tensor)
    if rank == 0:
        for other in range(1, world):
            dist.recv(tensor_list[other], src=other)
        for other in range(1, world):
            for owner in range(world):
                if owner != other:
                    dist.send(tensor_list[owner], dst=other)
    else:
        dist.send(tensor, dst=0)
        for owner in range(world):
            if owner != rank:
                dist.recv(tensor_list[owner], src=0)
