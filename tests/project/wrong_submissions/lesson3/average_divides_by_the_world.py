"""l3_average_gradients: 0 of 4. Sums over the group but divides by the size of the whole
world: right for the world, wrong for any smaller group."""

import torch.distributed as dist


def average_gradients(model, group=None):
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, group=group)
            param.grad /= dist.get_world_size()
