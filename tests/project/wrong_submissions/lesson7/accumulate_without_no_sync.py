"""l7_accumulate_no_sync: 4 of 12. Accumulation without no_sync: DDP all-reduces after every
micro-batch's backward. The same numbers (the mean of sums is the sum of means), K times
the traffic."""


def accumulation_step(ddp_model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    total = 0.0
    for inputs, targets in micro_batches:
        loss = loss_fn(ddp_model(inputs), targets)
        (loss / len(micro_batches)).backward()
        total += loss.item()
    optimizer.step()
    return total / len(micro_batches)
