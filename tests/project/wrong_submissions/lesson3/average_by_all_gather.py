"""l3_average_gradients: 4 of 4. Right another way: gather every rank's gradient with
all_gather and take the mean (more traffic than all_reduce, the same mean)."""

import torch
import torch.distributed as dist


def average_gradients(model, group=None):
    size = dist.get_world_size(group)
    for param in model.parameters():
        if param.grad is not None:
            gathered = [torch.empty_like(param.grad) for _ in range(size)]
            dist.all_gather(gathered, param.grad, group=group)
            param.grad.copy_(torch.stack(gathered).mean(dim=0))
