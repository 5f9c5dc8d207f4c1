"""l8_pipeline_step: 12 of 24. The world's size checked, not the group's.

dist.get_world_size() without the group: in a world of two it is right, but it lets a group
of one through (the world has two ranks), and it refuses the group of global ranks 1 and 2
of a world of three, a pipeline that should run.
"""

import torch
import torch.distributed as dist


def pipeline_step(stage, batch, num_micro_batches, activation_shape, loss_fn=F.cross_entropy,
                  group=None):
    if dist.get_world_size() != 2:
        raise ValueError(f"a two-stage pipeline needs 2 ranks, not {dist.get_world_size()}")
    if num_micro_batches < 1 or len(batch) % num_micro_batches:
        raise ValueError(f"{len(batch)} samples do not split into {num_micro_batches}")
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
