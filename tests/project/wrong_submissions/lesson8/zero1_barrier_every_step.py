"""l8_zero1_optimizer: 8 of 17. A barrier after the broadcasts, every step, to be safe.

The results are right, but the barrier is a collective nobody needs: each broadcast already
waits for its data, and the next step's backward needs nothing more. One more round of
messages and one more wait for the slowest rank, every step.
"""

import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def step(self):
        super().step()
        dist.barrier(group=self.group)
