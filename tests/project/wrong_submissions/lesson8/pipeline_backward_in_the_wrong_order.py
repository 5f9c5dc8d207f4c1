"""l8_pipeline_step: 2 of 24. The two stages go through the backwards in different orders.

Stage 1 sends the gradients last micro-batch first, as it should; stage 0 takes them as if
they came first micro-batch first, and back-propagates each through another micro-batch's
output. Same shapes, so nothing complains: only the gradients are wrong.
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
        for out in outputs:
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
        (loss / num_micro_batches).backward()
        dist.send(activation.grad, group_dst=0, group=group)
    return torch.stack([loss.detach() for loss in losses]).mean()
