"""l7_sync_batchnorm: 2 of 14. Divides by sqrt(var) + eps, as some write the formula,
instead of sqrt(var + eps): the same wherever the variance dwarfs eps, but on a channel
whose variance is near eps (or 0) the output and the gradients are far off. Only the
running statistics, which eps does not touch, score."""

import torch
import torch.distributed as dist


class EpsOutsideSyncBatchNorm(SyncBatchNormFunction):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, momentum, eps, group):
        channels = input.shape[1]
        stats = torch.cat([_channel_sums(input), _channel_sums(input * input),
                           torch.tensor([float(input.numel() // channels)])])
        dist.all_reduce(stats, group=group)
        n = stats[-1]
        mean = stats[:channels] / n
        var = stats[channels:2 * channels] / n - mean * mean
        invstd = 1 / (var.clamp(min=0).sqrt() + eps)
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
    return EpsOutsideSyncBatchNorm.apply(input, weight, bias, running_mean, running_var,
                                         momentum, eps, group)
