"""l7_accumulate_no_sync: 11 of 12. The step is right, but the loss returned is all-reduced
into the mean over every rank, not this rank's own mean: right in one process only."""

from contextlib import nullcontext

import torch
import torch.distributed as dist


def accumulation_step(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (inputs, targets) in enumerate(micro_batches):
        with nullcontext() if i == k - 1 else ddp_model.no_sync():
            loss = loss_fn(ddp_model(inputs), targets)
            (loss / k).backward()
        total += loss.item()
    optimizer.step()
    mean = torch.tensor([total / k])
    if dist.is_initialized():
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
    return mean.item()
