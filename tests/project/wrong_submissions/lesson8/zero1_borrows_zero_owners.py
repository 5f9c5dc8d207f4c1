"""l8_zero1_optimizer: 0 of 17. The reference's optimizer, but the owners come from the
course's own partition (ddpcourse.sharding.zero_owners, behind the lesson's tables) instead
of being worked out: the grader refuses it."""

import torch
import torch.distributed as dist


class Zero1Optimizer:
    def __init__(self, params, optimizer_class, group=None, **defaults):
        from ddpcourse.sharding import zero_owners

        self.group = group
        self.params = list(params)
        self.rank = dist.get_rank(group)
        self.owners = zero_owners([p.numel() for p in self.params], dist.get_world_size(group))
        mine = [p for p, owner in zip(self.params, self.owners, strict=True)
                if owner == self.rank]
        self.optimizer = optimizer_class(mine, **defaults) if mine else None

    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
        with torch.no_grad():
            for p, owner in zip(self.params, self.owners, strict=True):
                dist.broadcast(p.data, group_src=owner, group=self.group)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None
