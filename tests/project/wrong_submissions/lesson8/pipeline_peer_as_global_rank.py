"""l8_pipeline_step: 13 of 24. The other stage's group rank used as its global rank.

dist.send(t, dst=1 - me, group=group) reads dst as a global rank. In the world group the
two agree; in the group of global ranks 1 and 2 (a pipeline beside other work), stage 0
addresses global rank 1, itself, and stage 1 global rank 0, outside the group.
"""

import torch
import torch.distributed as dist


def pipeline_step(stage, batch, num_micro_batches, activation_shape, loss_fn=F.cross_entropy,
                  group=None):
    check_pipeline_arguments(batch, num_micro_batches, group)
    me = dist.get_rank(group)
    peer = 1 - me
    micro_batches = batch.chunk(num_micro_batches)
    if me == 0:
        outputs = []
        for x in micro_batches:
            outputs.append(stage(x))
            dist.send(outputs[-1].detach(), dst=peer, group=group)
        for out in reversed(outputs):
            grad = torch.empty(activation_shape)
            dist.recv(grad, src=peer, group=group)
            out.backward(grad)
        return None
    received, losses = [], []
    for targets in micro_batches:
        activation = torch.empty(activation_shape)
        dist.recv(activation, src=peer, group=group)
        received.append(activation.requires_grad_())
        losses.append(loss_fn(stage(activation), targets))
    for activation, loss in zip(reversed(received), reversed(losses), strict=True):
        (loss / num_micro_batches).backward()
        dist.send(activation.grad, dst=peer, group=group)
    return torch.stack([loss.detach() for loss in losses]).mean()
