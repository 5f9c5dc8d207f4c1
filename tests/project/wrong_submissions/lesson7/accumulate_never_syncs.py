"""l7_accumulate_no_sync: 2 of 12. Every micro-batch inside no_sync, the last one too: no
gradient is ever all-reduced, so each rank steps with its own gradients and the ranks drift
apart. Right only in a world of one."""


def accumulation_step(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    total = 0.0
    with ddp_model.no_sync():
        for inputs, targets in micro_batches:
            loss = loss_fn(ddp_model(inputs), targets)
            (loss / k).backward()
            total += loss.item()
    optimizer.step()
    return total / k
