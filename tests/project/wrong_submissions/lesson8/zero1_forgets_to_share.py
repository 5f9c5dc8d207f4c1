"""l8_zero1_optimizer: 8 of 17. Each rank steps its shard and shares nothing.

The optimizer state is split as it should be, but the updated parameters never leave
their owner: every rank keeps stale copies of the parameters others own, and from the first
step on the ranks train different models.
"""


class Zero1Optimizer(Zero1Optimizer):
    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
