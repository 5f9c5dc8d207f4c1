"""l8_zero1_optimizer: 16 of 17. An optimizer made even for a rank that owns nothing.

Right whenever every rank owns a parameter; with more ranks than parameters, the rank left
without one calls optimizer_class([]), which torch refuses ("optimizer got an empty
parameter list"), and its step never runs.
"""

import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def __init__(self, params, optimizer_class, group=None, **defaults):
        self.group = group
        self.params = list(params)
        world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        held = [0] * world
        self.owners = [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            self.owners[i] = held.index(min(held))
            held[self.owners[i]] += self.params[i].numel()
        mine = [p for p, o in zip(self.params, self.owners, strict=True) if o == self.rank]
        self.optimizer = optimizer_class(mine, **defaults)
