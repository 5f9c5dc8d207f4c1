"""l4_ring_allreduce: 4 of 10. Whole tensors passed round the ring instead of 1/W chunks.

The right sums, sent only to rank r+1 and received only from r-1, 2(W-1) messages each way:
but every message is the whole tensor, so each rank sends 2(W-1) tensors where a ring
sends 2(W-1)/W of one.
"""

import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1:
        return tensor
    right, left = (rank + 1) % world, (rank - 1) % world
    mine = tensor.clone()
    incoming = torch.empty_like(tensor)
    # "reduce": pass the running sum on; after W-1 steps every rank has added every tensor
    for _ in range(world - 1):
        ops = [dist.P2POp(dist.isend, tensor.clone(), right),
               dist.P2POp(dist.irecv, incoming, left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        tensor.copy_(mine + incoming)
    # "all-gather": W-1 more steps, as in the lesson's picture
    for _ in range(world - 1):
        ops = [dist.P2POp(dist.isend, tensor.clone(), right),
               dist.P2POp(dist.irecv, incoming, left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return tensor
