"""l8_pipeline_step: 2 of 24. The activations are detached and no gradient goes back.

Stage 1 learns, but the graph ends at the detached activation it received: stage 0's
parameters get no gradient at all, so the first half of the model never trains.
"""

import torch
import torch.distributed as dist


def pipeline_step(stage, batch, num_micro_batches, activation_shape, loss_fn=F.cross_entropy,
                  group=None):
    check_pipeline_arguments(batch, num_micro_batches, group)
    me = dist.get_rank(group)
    micro_batches = batch.chunk(num_micro_batches)
    if me == 0:
        for x in micro_batches:
            dist.send(stage(x).detach(), group_dst=1, group=group)
        return None
    losses = []
    for targets in micro_batches:
        activation = torch.empty(activation_shape)
        dist.recv(activation, group_src=0, group=group)
        losses.append(loss_fn(stage(activation), targets))
    for loss in reversed(losses):
        (loss / num_micro_batches).backward()
    return torch.stack([loss.detach() for loss in losses]).mean()
