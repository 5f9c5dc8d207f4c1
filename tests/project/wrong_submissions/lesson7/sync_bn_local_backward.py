"""l7_sync_batchnorm: 4 of 14. The forward combines every rank's statistics, but backward
uses this rank's sums of grad and grad * x_hat only: the output is right, the input's
gradient is not (it misses the other ranks' part of the mean and variance), and the
traffic counts only with the right gradients."""


class LocalBackwardSyncBatchNorm(SyncBatchNormFunction):
    @staticmethod
    def backward(ctx, grad_output):
        x_hat, weight, invstd, n = ctx.saved_tensors
        count = x_hat.numel() // x_hat.shape[1]  # this rank's values per channel
        grad_bias = _channel_sums(grad_output)
        grad_weight = _channel_sums(grad_output * x_hat)
        grad_input = _per_channel(weight * invstd, x_hat) * (
            grad_output - _per_channel(grad_bias / count, x_hat)
            - x_hat * _per_channel(grad_weight / count, x_hat))
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


def sync_batch_norm(input, running_mean, running_var, weight, bias, momentum=0.1, eps=1e-5,
                    group=None):
    return LocalBackwardSyncBatchNorm.apply(input, weight, bias, running_mean, running_var,
                                            momentum, eps, group)
