"""l4_fix_hang: 0 of 6. Every rank joins, but the all_reduce sums the caller's own loss in
place: the mean is right, the loss the caller keeps is now the sum over the ranks."""

import torch.distributed as dist


def report_loss(loss, rank):
    dist.all_reduce(loss)
    mean = loss.item() / dist.get_world_size()
    if rank == 0:
        print(f"mean loss over {dist.get_world_size()} ranks: {mean:.4f}", flush=True)
        return mean
    return None
