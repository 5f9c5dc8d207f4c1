"""Lesson 7 exercises: DDP's gradient buckets built by hand, a SyncBatchNorm that runs on the
CPU, and gradient accumulation that communicates once per optimizer step.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=7                                       # all of lesson 7, with a score table
    .venv/bin/pytest tests/grading -m l7_bucketed_allreduce   # one exercise

The grader calls your code in a one-process world first, then in torchrun jobs of 2 and 3
processes, in the world group and in sub-groups of it, where it compares the results with
what DDP, or nn.BatchNorm, or one process alone on all the data computes. It also watches
how your code communicates: which collectives it starts, on which group, how many, how big
(in bytes), and when (during backward, or after it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist  # noqa: F401  (your solutions will need it)
import torch.nn as nn

# --- l7_bucketed_allreduce ----------------------------------------------------------------

def bucket_assignment(sizes_in_bytes: list[int], bucket_cap_bytes: int) -> list[list[int]]:
    """Exercise l7_bucketed_allreduce: group the parameters into buckets, last one first.

    sizes_in_bytes[i] is the size of parameter i's gradient (numel x element size), the
    parameters in registration order (model.parameters()). Walk them from the LAST to the
    first, the order in which backward usually produces their gradients, and fill buckets
    greedily: a parameter joins the current bucket if the bucket's total stays within
    bucket_cap_bytes, else it starts a new bucket. A parameter bigger than the cap gets a
    bucket of its own. Return the buckets in the order they were filled, each a list of
    parameter indices in the order they joined. Raise ValueError if bucket_cap_bytes < 1.

    Example: bucket_assignment([48, 16, 32, 8], 40) == [[3, 2], [1], [0]]
    (8 + 32 = 40 fits; 16 more would not; 48 is over the cap on its own).

    DDP's own rule is close to this one but not the same: it fills buckets in registration
    order, closes a bucket once it reaches the cap (so a bucket can pass it), gives the
    first bucket a smaller cap, and then reverses the list of buckets.
    """
    raise NotImplementedError("l7_bucketed_allreduce: group the parameters into buckets")


class BucketedAllReduce:
    """Exercise l7_bucketed_allreduce: average a model's gradients as DDP does, by hand.

    Use it like this, every training step (the model is a plain module, not DDP):

        averager = BucketedAllReduce(model, bucket_cap_bytes=4096)    # once
        ...
        loss.backward()      # your hooks start each bucket's all-reduce as the bucket fills
        averager.finish()    # wait for them all: every p.grad is now the mean over the group
        optimizer.step()

    - The parameters are those of model.parameters() that require grad (float32; each gets a
      gradient in every backward pass, as DDP assumes by default). Group them with
      bucket_assignment of their gradients' sizes in bytes.
    - Register a hook on every parameter with p.register_post_accumulate_grad_hook(hook): it
      runs during backward, as soon as p.grad holds this step's gradient. When the last
      gradient of a bucket has arrived, flatten the bucket's gradients into one tensor and
      start dist.all_reduce(flat, group=group, async_op=True) right there, in the hook; keep
      the handle it returns. Do not wait for it in the hook: the point is that this bucket
      travels while backward goes on computing the gradients of the earlier layers.
    - finish(): wait for every handle, divide by the number of ranks in `group`
      (dist.get_world_size(group); group=None is the whole world), copy each parameter's
      slice of its bucket back into p.grad, and reset, so the next step starts afresh.

    Every rank builds the same buckets and starts them in the same order, so the all-reduces
    match. With any cap, the gradients after finish() equal those DDP computes from the
    same data. The grader checks that in the world group and in sub-groups (it splits the
    ranks into groups that run at once: {0} and {1} of 2, {0, 2} and {1} of 3; in a group
    of one the mean is the gradient itself). It counts your all-reduces in BYTES: one per
    bucket per step, on `group` and no other, each exactly its bucket's bytes with the
    gradients in their own dtype (a bucket converted to float64 is twice its size), none
    bigger than the cap unless a parameter alone is; and it notes when each one starts and
    when it is waited for.
    """

    def __init__(self, model: nn.Module, bucket_cap_bytes: int, group=None):
        raise NotImplementedError("l7_bucketed_allreduce: build the buckets, register hooks")

    def finish(self) -> None:
        raise NotImplementedError("l7_bucketed_allreduce: wait, average, copy back, reset")


# --- l7_sync_batchnorm --------------------------------------------------------------------

class SyncBatchNormFunction(torch.autograd.Function):
    """Exercise l7_sync_batchnorm: the forward and backward of a batch norm over all ranks.

    sync_batch_norm below calls SyncBatchNormFunction.apply(input, weight, bias,
    running_mean, running_var, momentum, eps, group). Channel c is dimension 1 of the
    input; the statistics run over every other dimension and over the batch of every rank in
    `group`. With n the number of values of a channel on those ranks together:

      forward:  mean = sum(x) / n, var = sum(x * x) / n - mean**2 (the biased variance),
                x_hat = (x - mean) / sqrt(var + eps), y = x_hat * weight + bias.
                The sums and n come from ONE all_reduce of [sum(x), sum(x * x), count] per
                channel (2C + 1 numbers; or an all_gather of them): never the input itself.
                Update the running statistics here too (forward runs without autograd).
      backward: with g = grad_output and, summed over the group, sum_g = sum(g) and
                sum_gx = sum(g * x_hat) per channel (one all_reduce of 2C numbers):
                grad_input  = weight / sqrt(var + eps) * (g - sum_g / n - x_hat * sum_gx / n)
                grad_weight = sum(g * x_hat) and grad_bias = sum(g), over THIS rank's values
                only: summed over the ranks (DDP's gradient averaging does that) they are
                BatchNorm's gradients on the whole batch. Return one gradient per input of
                forward: None for those that are not tensors needing one.

    eps goes where the formulas put it, inside the square root: the grader feeds a channel
    whose variance is near eps and a constant one (variance 0), where sqrt(var) + eps or a
    missing eps gives a different output, and calls with eps and momentum other than the
    defaults. Each pass, forward and backward, may communicate at most 16 (C + 1) bytes per
    rank of the group (the statistics, float32 or float64, all-reduced or all-gathered),
    whatever the batch; only to the ranks of `group`. That traffic counts only when the
    output and the gradients are right.
    """

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, momentum, eps, group):
        raise NotImplementedError("l7_sync_batchnorm: normalise with every rank's statistics")

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError("l7_sync_batchnorm: the gradients, with every rank's sums")


def sync_batch_norm(input: torch.Tensor, running_mean: torch.Tensor | None,
                    running_var: torch.Tensor | None, weight: torch.Tensor,
                    bias: torch.Tensor, momentum: float = 0.1, eps: float = 1e-5,
                    group=None) -> torch.Tensor:
    """Exercise l7_sync_batchnorm: batch normalisation in training mode, over the batches of
    every rank in `group` together, on the CPU (torch's nn.SyncBatchNorm refuses CPU
    tensors).

    input is this rank's batch, (N, C) or (N, C, ...); N may differ from rank to rank, and
    be 1 on some. The output, and the gradients of input, weight and bias, must equal those
    of nn.BatchNorm applied to all the group's batches concatenated (in rank order): each
    rank gets its own rows of the output and of the input's gradient, and its own share of
    the weight's and bias's gradients (see SyncBatchNormFunction). Use
    SyncBatchNormFunction.apply. group=None is the whole world; given a sub-group (the
    grader runs {0, 2} and {1} of 3 at once, and groups of one), only its ranks' batches
    count and only its ranks are communicated with.

    running_mean and running_var (each None or a tensor of C values) are updated in place as
    nn.BatchNorm updates them: (1 - momentum) * old + momentum * the batch's value, where the
    batch is the group's batches together and running_var takes the UNBIASED variance
    (var * n / (n - 1)).
    """
    raise NotImplementedError("l7_sync_batchnorm: a batch norm over every rank's batch")


# --- l7_accumulate_no_sync ----------------------------------------------------------------

def accumulation_step(ddp_model: nn.Module, optimizer: torch.optim.Optimizer,
                      micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
                      loss_fn) -> float:
    """Exercise l7_accumulate_no_sync: one optimizer step from K micro-batches, with ONE
    all-reduce of the gradients.

    ddp_model is a DistributedDataParallel model; micro_batches is this rank's list of K
    (inputs, targets) pairs, all of the same size; loss_fn(outputs, targets) is a
    micro-batch's mean loss. Zero the gradients, then for each micro-batch: forward, scale
    the loss by 1/K, backward. The first K - 1 micro-batches, forward and backward, go
    inside `with ddp_model.no_sync():` (the gradients add up locally, nothing is sent; DDP
    decides in forward whether the backward that follows communicates, so the forward
    belongs inside too); the last one outside it, so DDP all-reduces the accumulated
    gradients, once. Then one optimizer.step(). K may be 1: then nothing runs inside
    no_sync.

    Return this rank's mean loss, as a Python float: the mean of the K values loss_fn
    returned in this step's forwards (so computed with the parameters the step started
    from), not scaled by 1/K, not the last micro-batch's alone, not averaged over the ranks.

    The step equals one step on the big batch (every rank's K micro-batches together) in a
    single process: the grader checks that, and counts the all-reduced gradient values per
    optimizer step (the parameters' worth once, not K times). In its one-process test,
    ddp_model is a stand-in that behaves as DDP does: call it, use no_sync() or .module.
    """
    raise NotImplementedError("l7_accumulate_no_sync: K micro-batches, one all-reduce, a step")
