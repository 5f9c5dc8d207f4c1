"""l8_zero1_optimizer: 13 of 17. Its own rank taken in the world, the owners' in the group.

self.rank = dist.get_rank() is the global rank. In the world it is the group rank; in the
group of global ranks 1 and 2 it is 1 and 2, so global rank 1 steps group rank 1's shard
and global rank 2 steps none, while the broadcasts go out from the group ranks: the
parameters of group rank 0's shard are never stepped.
"""

import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def __init__(self, params, optimizer_class, group=None, **defaults):
        self.group = group
        self.params = list(params)
        world, self.rank = dist.get_world_size(group), dist.get_rank()
        held = [0] * world
        self.owners = [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            self.owners[i] = held.index(min(held))
            held[self.owners[i]] += self.params[i].numel()
        mine = [p for p, o in zip(self.params, self.owners, strict=True) if o == self.rank]
        self.optimizer = optimizer_class(mine, **defaults) if mine else None
