"""l7_sync_batchnorm: 4 of 14. Backward all-reduces the weight's and bias's gradients too, so
every rank holds the whole batch's: summed again by DDP's averaging over the ranks they
come out W times too big. Each rank's share is its own values' sum (and the traffic
counts only with the right gradients)."""

import torch
import torch.distributed as dist


class SummedGradsSyncBatchNorm(SyncBatchNormFunction):
    @staticmethod
    def backward(ctx, grad_output):
        grads = SyncBatchNormFunction.backward(ctx, grad_output)
        grad_input, grad_weight, grad_bias = grads[:3]
        both = torch.cat([grad_weight, grad_bias])
        dist.all_reduce(both, group=ctx.group)
        channels = grad_weight.numel()
        return grad_input, both[:channels], both[channels:], *grads[3:]


def sync_batch_norm(input, running_mean, running_var, weight, bias, momentum=0.1, eps=1e-5,
                    group=None):
    return SummedGradsSyncBatchNorm.apply(input, weight, bias, running_mean, running_var,
                                          momentum, eps, group)
