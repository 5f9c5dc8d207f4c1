"""l8_zero1_optimizer: 10 of 17. Every rank's copy of every parameter all-gathered.

For each parameter every rank contributes its copy and keeps the owner's: the right values,
but every parameter travels from every rank, the group's size times the bytes a broadcast
from the owner moves (a group of one moves just the parameters, and passes there).
"""

import torch
import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
        world = dist.get_world_size(self.group)
        with torch.no_grad():
            for p, owner in zip(self.params, self.owners, strict=True):
                copies = [torch.empty_like(p) for _ in range(world)]
                dist.all_gather(copies, p.detach().contiguous(), group=self.group)
                p.copy_(copies[owner])
