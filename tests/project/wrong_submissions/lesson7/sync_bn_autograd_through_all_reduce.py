"""l7_sync_batchnorm: 14 of 14. A right answer written another way: no Function of its own;
the statistics are summed with torch.distributed.nn's differentiable all_reduce, and
autograd derives the backward (whose all-reduce carries the 2C + 1 statistics' gradients).
Accepted."""

import warnings

import torch
import torch.distributed.nn.functional as dist_nn


def sync_batch_norm(input, running_mean, running_var, weight, bias, momentum=0.1, eps=1e-5,
                    group=None):
    channels = input.shape[1]
    count = torch.tensor([float(input.numel() // channels)])
    stats = torch.cat([_channel_sums(input), _channel_sums(input * input), count])
    with warnings.catch_warnings():  # deprecated in favour of functional collectives
        warnings.simplefilter("ignore", FutureWarning)
        stats = dist_nn.all_reduce(stats, group=group or torch.distributed.group.WORLD)
    n = stats[-1]
    mean = stats[:channels] / n
    var = stats[channels:2 * channels] / n - mean * mean
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(momentum * mean)
        if running_var is not None:
            running_var.mul_(1 - momentum).add_(momentum * var * n / (n - 1))
    x_hat = (input - _per_channel(mean, input)) * _per_channel(torch.rsqrt(var + eps), input)
    return x_hat * _per_channel(weight, input) + _per_channel(bias, input)
