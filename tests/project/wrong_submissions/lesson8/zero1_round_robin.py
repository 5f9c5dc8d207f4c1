"""l8_zero1_optimizer: 16 of 17. Parameters dealt round-robin by their position.

Right in every way but balance: parameter i goes to rank i % W whatever its size, so with
the weights at even positions and the biases at odd ones, one rank steps (and keeps the
state of) nearly all the elements.
"""

import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def __init__(self, params, optimizer_class, group=None, **defaults):
        self.group = group
        self.params = list(params)
        world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.owners = [i % world for i in range(len(self.params))]
        mine = [p for p, o in zip(self.params, self.owners, strict=True) if o == self.rank]
        self.optimizer = optimizer_class(mine, **defaults) if mine else None
