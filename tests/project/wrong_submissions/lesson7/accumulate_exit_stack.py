"""l7_accumulate_no_sync: 12 of 12. A right answer written another way: no_sync entered once
for the first K - 1 micro-batches through an ExitStack and closed before the last, and
the loss reported as the sum of the scaled losses (the same mean). Accepted."""

from contextlib import ExitStack


def accumulation_step(ddp_model, optimizer, micro_batches, loss_fn):
    *first, last = micro_batches
    scale = 1 / len(micro_batches)
    optimizer.zero_grad()
    reported = 0.0
    with ExitStack() as stack:
        stack.enter_context(ddp_model.no_sync())
        for inputs, targets in first:
            loss = loss_fn(ddp_model(inputs), targets) * scale
            loss.backward()
            reported += loss.item()
    loss = loss_fn(ddp_model(last[0]), last[1]) * scale
    loss.backward()  # outside no_sync: DDP all-reduces everything accumulated, once
    optimizer.step()
    return reported + loss.item()
