"""l8_zero1_optimizer: 13 of 17. The owner's group rank passed as src=, which is global.

dist.broadcast(p, src=owner, group=group) reads src as a global rank. In the world the two
agree; in the group of global ranks 1 and 2, owner 0 (global rank 1) becomes global rank 0,
outside the group, and torch refuses; in the group of global rank 1 alone, the same. Only
the sub-group tests see it.
"""

import torch
import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
        with torch.no_grad():
            for p, owner in zip(self.params, self.owners, strict=True):
                dist.broadcast(p.data, src=owner, group=self.group)
