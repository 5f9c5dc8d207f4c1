"""l7_accumulate_no_sync: 12 of 12. A right answer written another way: the first K - 1
micro-batches go through the wrapped module itself (ddp_model.module), which DDP does not
watch, so their backward communicates nothing; the last goes through DDP. Accepted."""


def accumulation_step(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (inputs, targets) in enumerate(micro_batches):
        forward = ddp_model if i == k - 1 else ddp_model.module
        loss = loss_fn(forward(inputs), targets)
        (loss / k).backward()
        total += loss.item()
    optimizer.step()
    return total / k
