"""l8_pipeline_step: 22 of 24. No check of the group or of the micro-batch count.

Right on every argument it should accept. Handed a group of one, three ranks or a batch
that does not split into M, it starts anyway: it runs its stage and waits for messages the
other stage will never send (or sends them to a rank that is not there), where a clear
ValueError was promised.
"""

import torch
import torch.distributed as dist


def pipeline_step(stage, batch, num_micro_batches, activation_shape, loss_fn=F.cross_entropy,
                  group=None):
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
        (loss / num_micro_batches).backward()
        dist.send(activation.grad, group_dst=0, group=group)
    return torch.stack([loss.detach() for loss in losses]).mean()
