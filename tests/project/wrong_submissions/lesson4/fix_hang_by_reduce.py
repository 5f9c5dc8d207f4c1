"""l4_fix_hang: 6 of 6. Right another way: every rank joins a dist.reduce to rank 0, the
only rank that needs the sum."""

import torch.distributed as dist


def report_loss(loss, rank):
    total = loss.detach().clone()
    dist.reduce(total, dst=0)
    if rank == 0:
        mean = total.item() / dist.get_world_size()
        print(f"mean loss over {dist.get_world_size()} ranks: {mean:.4f}", flush=True)
        return mean
    return None
