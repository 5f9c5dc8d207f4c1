"""l8_zero1_optimizer: 0 of 17. Hands the work to torch's ZeroRedundancyOptimizer, which the
exercise asks you to build: the grader refuses it."""

from torch.distributed.optim import ZeroRedundancyOptimizer


class Zero1Optimizer:
    def __init__(self, params, optimizer_class, group=None, **defaults):
        self.params = list(params)
        self.optimizer = ZeroRedundancyOptimizer(self.params, optimizer_class,
                                                 process_group=group, **defaults)
        self.owners = [0] * len(self.params)

    def step(self):
        self.optimizer.step()

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)
