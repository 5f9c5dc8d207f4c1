"""l7_sync_batchnorm: 0 of 14. Forward and backward all-reduce over the whole world, whatever
group was given: right in the world group, but in a sub-group every rank normalises with
statistics mixed from ranks outside it, so the output, the gradients and the running
statistics are wrong there."""

import torch.distributed as dist


class WorldSyncBatchNorm(SyncBatchNormFunction):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, momentum, eps, group):
        return SyncBatchNormFunction.forward(ctx, input, weight, bias, running_mean,
                                             running_var, momentum, eps, dist.group.WORLD)


def sync_batch_norm(input, running_mean, running_var, weight, bias, momentum=0.1, eps=1e-5,
                    group=None):
    return WorldSyncBatchNorm.apply(input, weight, bias, running_mean, running_var,
                                    momentum, eps, group)
