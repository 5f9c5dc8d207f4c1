"""l8_pipeline_step: 6 of 24. The whole batch crosses in one message each way.

Stage 0 runs the whole batch and sends one activation; stage 1 answers with one gradient.
The gradients are right, but that is a model split over two processes with no pipeline:
while one stage works the other waits. Micro-batches are what let the stages overlap.
"""

import torch
import torch.distributed as dist


def pipeline_step(stage, batch, num_micro_batches, activation_shape, loss_fn=F.cross_entropy,
                  group=None):
    check_pipeline_arguments(batch, num_micro_batches, group)
    me = dist.get_rank(group)
    whole = (activation_shape[0] * num_micro_batches, *activation_shape[1:])
    if me == 0:
        out = stage(batch)
        dist.send(out.detach(), group_dst=1, group=group)
        grad = torch.empty(whole)
        dist.recv(grad, group_src=1, group=group)
        out.backward(grad)
        return None
    activation = torch.empty(whole)
    dist.recv(activation, group_src=0, group=group)
    activation.requires_grad_()
    loss = loss_fn(stage(activation), batch)
    loss.backward()
    dist.send(activation.grad, group_dst=0, group=group)
    return loss.detach()
