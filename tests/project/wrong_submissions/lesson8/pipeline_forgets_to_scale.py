"""l8_pipeline_step: 2 of 24. Each micro-batch's loss back-propagated without the 1/M.

The messages are right, but the gradients summed over M micro-batches are M times those of
the whole batch's mean loss: each micro-batch's loss is already a mean over its samples.
"""

import torch
import torch.distributed as dist


def pipeline_step(stage, batch, num_micro_batches, activation_shape, loss_fn=F.cross_entropy,
                  group=None):
    check_pipeline_arguments(batch, num_micro_batches, group)
    me = dist.get_rank(group)
    micro_batches = batch.chunk(num_micro_batches)
    if me == 0:
        outputs = []
        for x in micro_batches:
            outputs.append(stage(x))
            dist.send(outputs[-1].detach(), group_dst=1, group=group)
        for out in reversed(outputs):
            grad = torch.empty(activation_shape)
            dist.recv(grad, group_src=1, group=group)
            out.backward(grad)
        return None
    received, losses = [], []
    for targets in micro_batches:
        activation = torch.empty(activation_shape)
        dist.recv(activation, group_src=0, group=group)
        received.append(activation.requires_grad_())
        losses.append(loss_fn(stage(activation), targets))
    for activation, loss in zip(reversed(received), reversed(losses), strict=True):
        loss.backward()
        dist.send(activation.grad, group_dst=0, group=group)
    return torch.stack([loss.detach() for loss in losses]).mean()
