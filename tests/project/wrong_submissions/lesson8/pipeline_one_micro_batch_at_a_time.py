"""l8_pipeline_step: 12 of 24. Each micro-batch's forward and backward before the next's.

Right gradients and the right messages, but no pipeline: stage 0 waits for micro-batch i's
gradient before it starts micro-batch i+1, so the two stages never work at once. GPipe runs
every forward first.
"""

import torch
import torch.distributed as dist


def pipeline_step(stage, batch, num_micro_batches, activation_shape, loss_fn=F.cross_entropy,
                  group=None):
    check_pipeline_arguments(batch, num_micro_batches, group)
    me = dist.get_rank(group)
    losses = []
    for part in batch.chunk(num_micro_batches):
        if me == 0:
            out = stage(part)
            dist.send(out.detach(), group_dst=1, group=group)
            grad = torch.empty(activation_shape)
            dist.recv(grad, group_src=1, group=group)
            out.backward(grad)
        else:
            activation = torch.empty(activation_shape)
            dist.recv(activation, group_src=0, group=group)
            activation.requires_grad_()
            loss = loss_fn(stage(activation), part)
            (loss / num_micro_batches).backward()
            dist.send(activation.grad, group_dst=0, group=group)
            losses.append(loss.detach())
    return torch.stack(losses).mean() if me == 1 else None
