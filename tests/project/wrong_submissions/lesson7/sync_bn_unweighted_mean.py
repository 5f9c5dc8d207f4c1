"""l7_sync_batchnorm: 0 of 14. Each rank computes its own mean and variance, and the ranks
average them, as if every batch were the same size: with batches of 2, 5 and 8 samples the
mean is not the whole batch's mean, so nothing downstream is right either."""

import torch
import torch.distributed as dist


class UnweightedSyncBatchNorm(SyncBatchNormFunction):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, momentum, eps, group):
        world = dist.get_world_size(group)
        dims = [0, *range(2, input.dim())]
        stats = torch.cat([input.mean(dims), input.var(dims, unbiased=False)])
        dist.all_reduce(stats, group=group)
        stats /= world  # the mean of the ranks' means
        channels = input.shape[1]
        mean, var = stats[:channels], stats[channels:]
        n = torch.tensor(float(input.numel() // channels * world))
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(momentum * mean)
        if running_var is not None:
            running_var.mul_(1 - momentum).add_(momentum * var * n / (n - 1))
        x_hat = (input - _per_channel(mean, input)) * _per_channel(invstd, input)
        ctx.save_for_backward(x_hat, weight, invstd, n)
        ctx.group = group
        return x_hat * _per_channel(weight, input) + _per_channel(bias, input)


def sync_batch_norm(input, running_mean, running_var, weight, bias, momentum=0.1, eps=1e-5,
                    group=None):
    return UnweightedSyncBatchNorm.apply(input, weight, bias, running_mean, running_var,
                                         momentum, eps, group)
