"""l4_fix_hang: 0 of 6. The code as handed out: only rank 0 joins the all_reduce."""

import torch.distributed as dist


def report_loss(loss, rank):
    if rank == 0:
        total = loss.detach().clone()
        dist.all_reduce(total)
        mean = total.item() / dist.get_world_size()
        print(f"mean loss over {dist.get_world_size()} ranks: {mean:.4f}", flush=True)
        return mean
    return None
