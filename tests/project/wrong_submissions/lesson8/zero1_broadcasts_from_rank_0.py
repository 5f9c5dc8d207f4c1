"""l8_zero1_optimizer: 8 of 17. Every parameter broadcast from rank 0, not from its owner.

The state is split and the parameters do travel by broadcast, but from rank 0 whatever
the owner: the shards the other ranks stepped are overwritten by rank 0's stale copies, so
those parameters never change. The ranks agree, on the wrong model.
"""

import torch
import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
        with torch.no_grad():
            for p in self.params:
                dist.broadcast(p.data, group_src=0, group=self.group)
