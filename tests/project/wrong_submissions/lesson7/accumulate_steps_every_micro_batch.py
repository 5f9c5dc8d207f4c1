"""l7_accumulate_no_sync: 0 of 12. The optimizer steps (and the gradients are zeroed) after
every micro-batch: K small steps, not one step on the big batch (and the losses it
averages were taken at K different parameters)."""

from contextlib import nullcontext


def accumulation_step(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    total = 0.0
    for i, (inputs, targets) in enumerate(micro_batches):
        optimizer.zero_grad()
        with nullcontext() if i == k - 1 else ddp_model.no_sync():
            loss = loss_fn(ddp_model(inputs), targets)
            (loss / k).backward()
        optimizer.step()
        total += loss.item()
    return total / k
