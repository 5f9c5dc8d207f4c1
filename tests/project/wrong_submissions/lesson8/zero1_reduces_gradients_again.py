"""l8_zero1_optimizer: 8 of 17. Every gradient reduced to its owner again, after DDP averaged it.

Before stepping its shard, each rank sums every parameter's gradient onto the parameter's
owner with dist.reduce and divides by the group's size. DDP's all-reduce has already made the
gradients equal everywhere, so the numbers come out right; but every step now moves the whole
model's gradients a second time, which is what ZeRO-1 exists to avoid (it only broadcasts the
updated parameters). The traffic of step() gives it away, in the world, in a sub-group and
with a rank that owns nothing.
"""

import torch
import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def step(self):
        with torch.no_grad():
            for p, owner in zip(self.params, self.owners, strict=True):
                if p.grad is not None:
                    dist.reduce(p.grad, group_dst=owner, group=self.group)
                    if owner == self.rank:
                        p.grad /= dist.get_world_size(self.group)
        super().step()
