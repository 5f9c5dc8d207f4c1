"""l7_accumulate_no_sync: 1 of 12. no_sync done right, but each micro-batch's loss is not
scaled by 1/K: the accumulated gradient is K times the big batch's, a step K times too
long. Only the loss it returns is right."""

from contextlib import nullcontext


def accumulation_step(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (inputs, targets) in enumerate(micro_batches):
        with nullcontext() if i == k - 1 else ddp_model.no_sync():
            loss = loss_fn(ddp_model(inputs), targets)
            loss.backward()
        total += loss.item()
    optimizer.step()
    return total / k
