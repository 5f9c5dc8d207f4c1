"""l8_zero1_optimizer: 6 of 17. Every rank steps all the parameters: plain data parallelism.

The owners are worked out, but the wrapped optimizer is built over every parameter, so
every rank keeps the whole optimizer state, the very memory ZeRO-1 exists to split. The
numbers are right (the ranks all step the same averaged gradients) and nothing needs
sharing, so nothing is communicated.
"""

import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def __init__(self, params, optimizer_class, group=None, **defaults):
        self.group = group
        self.params = list(params)
        world = dist.get_world_size(group)
        held = [0] * world
        self.owners = [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            self.owners[i] = held.index(min(held))
            held[self.owners[i]] += self.params[i].numel()
        self.optimizer = optimizer_class(self.params, **defaults)

    def step(self):
        self.optimizer.step()
