"""l7_accumulate_no_sync: 4 of 12. no_sync around backward only: DDP decides in forward
whether the next backward communicates, so every micro-batch is still all-reduced. The
same numbers, K times the traffic (torch's docs warn of exactly this)."""


def accumulation_step(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    for i, (inputs, targets) in enumerate(micro_batches):
        loss = loss_fn(ddp_model(inputs), targets)
        if i < k - 1:
            with ddp_model.no_sync():
                (loss / k).backward()
        else:
            (loss / k).backward()
        total += loss.item()
    optimizer.step()
    return total / k
