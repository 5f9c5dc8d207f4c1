"""Lesson 7 exercises, reference solutions. See lessons/lesson7/exercises.py for the tasks."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn

# --- l7_bucketed_allreduce ----------------------------------------------------------------

def bucket_assignment(sizes_in_bytes: list[int], bucket_cap_bytes: int) -> list[list[int]]:
    if bucket_cap_bytes < 1:
        raise ValueError(f"bucket_cap_bytes must be at least 1, got {bucket_cap_bytes}")
    buckets: list[list[int]] = []
    filled = 0
    for index in reversed(range(len(sizes_in_bytes))):
        size = sizes_in_bytes[index]
        if buckets and filled + size <= bucket_cap_bytes:
            buckets[-1].append(index)
            filled += size
        else:
            buckets.append([index])
            filled = size
    return buckets


class BucketedAllReduce:
    def __init__(self, model: nn.Module, bucket_cap_bytes: int, group=None):
        self.group = group
        self.params = [p for p in model.parameters() if p.requires_grad]
        sizes = [p.numel() * p.element_size() for p in self.params]
        self.buckets = bucket_assignment(sizes, bucket_cap_bytes)
        self.bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket}
        self.waiting = [len(bucket) for bucket in self.buckets]  # gradients still to come
        self.launched: list[tuple[int, torch.Tensor, dist.Work]] = []
        for index, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(self._hook_for(index))

    def _hook_for(self, index: int):
        def hook(param: torch.Tensor) -> None:
            b = self.bucket_of[index]
            self.waiting[b] -= 1
            if self.waiting[b] == 0:  # the bucket's last gradient: send it now, in backward
                flat = torch.cat([self.params[i].grad.flatten() for i in self.buckets[b]])
                handle = dist.all_reduce(flat, group=self.group, async_op=True)
                self.launched.append((b, flat, handle))
        return hook

    def finish(self) -> None:
        world = dist.get_world_size(self.group)
        for b, flat, handle in self.launched:
            handle.wait()
            flat /= world
            offset = 0
            for i in self.buckets[b]:
                grad = self.params[i].grad
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        self.launched = []
        self.waiting = [len(bucket) for bucket in self.buckets]


# --- l7_sync_batchnorm --------------------------------------------------------------------

def _channel_sums(t: torch.Tensor) -> torch.Tensor:
    """Per-channel sums of an (N, C, ...) tensor: over every dimension but 1."""
    return t.transpose(0, 1).reshape(t.shape[1], -1).sum(dim=1)


def _per_channel(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """C values shaped to broadcast against an (N, C, ...) tensor."""
    return values.view(1, -1, *([1] * (like.dim() - 2)))


class SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, momentum, eps, group):
        channels = input.shape[1]
        count = input.numel() // channels
        stats = torch.cat([_channel_sums(input), _channel_sums(input * input),
                           input.new_tensor([float(count)])])
        dist.all_reduce(stats, group=group)  # 2C + 1 numbers, whatever the batch
        n = stats[-1]
        mean = stats[:channels] / n
        var = stats[channels:2 * channels] / n - mean * mean
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:  # forward runs without autograd: plain in-place updates
            running_mean.mul_(1 - momentum).add_(momentum * mean)
        if running_var is not None:
            running_var.mul_(1 - momentum).add_(momentum * var * n / (n - 1))
        x_hat = (input - _per_channel(mean, input)) * _per_channel(invstd, input)
        ctx.save_for_backward(x_hat, weight, invstd, n)
        ctx.group = group
        return x_hat * _per_channel(weight, input) + _per_channel(bias, input)

    @staticmethod
    def backward(ctx, grad_output):
        x_hat, weight, invstd, n = ctx.saved_tensors
        channels = x_hat.shape[1]
        grad_bias = _channel_sums(grad_output)
        grad_weight = _channel_sums(grad_output * x_hat)
        sums = torch.cat([grad_bias, grad_weight])
        dist.all_reduce(sums, group=ctx.group)  # 2C numbers
        mean_g = _per_channel(sums[:channels] / n, x_hat)
        mean_gx = _per_channel(sums[channels:] / n, x_hat)
        grad_input = _per_channel(weight * invstd, x_hat) * (
            grad_output - mean_g - x_hat * mean_gx)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


def sync_batch_norm(input: torch.Tensor, running_mean: torch.Tensor | None,
                    running_var: torch.Tensor | None, weight: torch.Tensor,
                    bias: torch.Tensor, momentum: float = 0.1, eps: float = 1e-5,
                    group=None) -> torch.Tensor:
    return SyncBatchNormFunction.apply(input, weight, bias, running_mean, running_var,
                                       momentum, eps, group)


# --- l7_accumulate_no_sync ----------------------------------------------------------------

def accumulation_step(ddp_model: nn.Module, optimizer: torch.optim.Optimizer,
                      micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                      loss_fn) -> float:
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (inputs, targets) in enumerate(micro_batches):
        # DDP decides in forward whether the backward that follows communicates, so the
        # forward belongs inside no_sync too.
        last = i == k - 1
        with nullcontext() if last else ddp_model.no_sync():
            loss = loss_fn(ddp_model(inputs), targets)
            (loss / k).backward()  # the last one: DDP all-reduces the accumulated gradients
        total += loss.item()
    optimizer.step()
    return total / k
