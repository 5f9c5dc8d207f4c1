"""l7_sync_batchnorm: 14 of 14. A right answer written another way: the statistics in
float64, the mean from one all-reduce of [sum(x), count] and the variance from a second
of sum((x - mean)**2), which loses no digits to sum(x * x) / n - mean**2. Twice the bytes
per value and one collective more, still O(channels). Accepted."""

import torch
import torch.distributed as dist


class TwoPassSyncBatchNorm(SyncBatchNormFunction):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, momentum, eps, group):
        channels = input.shape[1]
        x = input.double()
        first = torch.cat([_channel_sums(x), torch.tensor([float(x.numel() // channels)],
                                                         dtype=torch.float64)])
        dist.all_reduce(first, group=group)
        n = first[-1]
        mean = first[:channels] / n
        centred = x - _per_channel(mean, x)
        squares = _channel_sums(centred * centred)
        dist.all_reduce(squares, group=group)
        var = squares / n
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
        if running_var is not None:
            running_var.mul_(1 - momentum).add_(momentum * (var * n / (n - 1))
                                                .to(running_var.dtype))
        x_hat = (centred * _per_channel(invstd, x)).to(input.dtype)
        invstd, n = invstd.to(input.dtype), n.to(input.dtype)
        ctx.save_for_backward(x_hat, weight, invstd, n)
        ctx.group = group
        return x_hat * _per_channel(weight, input) + _per_channel(bias, input)


def sync_batch_norm(input, running_mean, running_var, weight, bias, momentum=0.1, eps=1e-5,
                    group=None):
    return TwoPassSyncBatchNorm.apply(input, weight, bias, running_mean, running_var,
                                      momentum, eps, group)
