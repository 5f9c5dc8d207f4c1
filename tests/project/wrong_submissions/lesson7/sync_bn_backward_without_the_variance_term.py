"""l7_sync_batchnorm: 4 of 14. Backward treats the variance as a constant: grad_input =
weight / sqrt(var + eps) * (g - sum_g / n), without the x_hat * sum_gx / n term that
comes from the variance depending on every input. The output and the running statistics
are right, the input's gradient is not, and the traffic counts only with the right
gradients."""

import torch
import torch.distributed as dist


class NoVarianceTermSyncBatchNorm(SyncBatchNormFunction):
    @staticmethod
    def backward(ctx, grad_output):
        x_hat, weight, invstd, n = ctx.saved_tensors
        channels = x_hat.shape[1]
        grad_bias = _channel_sums(grad_output)
        grad_weight = _channel_sums(grad_output * x_hat)
        sums = torch.cat([grad_bias, grad_weight])
        dist.all_reduce(sums, group=ctx.group)
        mean_g = _per_channel(sums[:channels] / n, x_hat)
        grad_input = _per_channel(weight * invstd, x_hat) * (grad_output - mean_g)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


def sync_batch_norm(input, running_mean, running_var, weight, bias, momentum=0.1, eps=1e-5,
                    group=None):
    return NoVarianceTermSyncBatchNorm.apply(input, weight, bias, running_mean, running_var,
                                             momentum, eps, group)
