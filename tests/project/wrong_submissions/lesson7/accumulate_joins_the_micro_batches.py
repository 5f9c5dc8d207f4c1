"""l7_accumulate_no_sync: 6 of 12. Joins the K micro-batches into one batch and runs one
forward and backward: the same numbers and one all-reduce, but no accumulation at all, so
the memory for a big batch that accumulation exists to avoid is needed after all."""

import torch


def accumulation_step(ddp_model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    inputs = torch.cat([x for x, _ in micro_batches])
    targets = torch.cat([y for _, y in micro_batches])
    loss = loss_fn(ddp_model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.item()
