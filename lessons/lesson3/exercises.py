"""Lesson 3 exercises: batch arithmetic, the sampler's split, gradient averaging, a DDP loop.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=3                                  # all of lesson 3, with a score table
    .venv/bin/pytest tests/grading -m l3_sampler_indices  # one exercise

The last two exercises run inside a real job: the grader starts them with torchrun on 2 and
3 processes and compares the results with what DDP, or one process alone, computes.
"""

from __future__ import annotations

# What your solutions will need (unused until you write them):
import math  # noqa: F401

import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401
import torch.nn as nn
import torch.nn.functional as F  # noqa: F401
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: F401
from torch.utils.data import DataLoader, DistributedSampler  # noqa: F401


def per_process_batch(global_batch: int, world_size: int) -> int:
    """Exercise l3_batch_and_lr: each process's share of the global batch.

    The global batch (samples per optimizer step, all processes together) must split into
    `world_size` equal whole shares. Raise ValueError when it cannot: a world size below 1, a
    global batch below 1, smaller than the world size, or not divisible by it.
    Example: per_process_batch(256, 4) == 64; per_process_batch(256, 3) raises ValueError.
    """
    raise NotImplementedError("l3_batch_and_lr: split the global batch over the processes")


def effective_batch(per_process: int, world_size: int, accumulation_steps: int = 1) -> int:
    """Exercise l3_batch_and_lr: samples behind one optimizer step.

    Every process runs `accumulation_steps` forward/backward passes of `per_process` samples
    before the gradients are averaged and the optimizer steps. Raise ValueError when an
    argument is below 1. Example: effective_batch(32, 4, accumulation_steps=2) == 256.
    """
    raise NotImplementedError("l3_batch_and_lr: count the samples per optimizer step")


def scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """Exercise l3_batch_and_lr: the linear scaling rule.

    `base_lr` was tuned for a global batch of `base_batch`; return the learning rate for a
    global batch of `batch`, scaled in proportion. Raise ValueError when a batch is below 1
    or base_lr is not positive. Example: scaled_lr(0.1, 256, 1024) == 0.4.
    """
    raise NotImplementedError("l3_batch_and_lr: scale the learning rate with the batch")


def sampler_indices(length: int, world_size: int, rank: int, shuffle: bool = True,
                    seed: int = 0, epoch: int = 0, drop_last: bool = False) -> list[int]:
    """Exercise l3_sampler_indices: the dataset indices `rank` reads in `epoch`.

    Return exactly what `list(DistributedSampler(dataset_of_length, world_size, rank,
    shuffle, seed, drop_last))` gives after `set_epoch(epoch)`, without using it:

    - the order: range(length), or when shuffling, torch.randperm(length, generator=g) with
      g = torch.Generator() seeded with seed + epoch (every rank computes the same order);
    - every rank gets the same number n of samples: n = ceil(length / world_size), except
      with drop_last and a length not divisible by world_size, where
      n = ceil((length - world_size) / world_size);
    - the order is made exactly world_size * n long: without drop_last by appending its own
      beginning (repeated as often as needed when it is very short), with drop_last by
      cutting off its tail;
    - rank r takes every world_size-th index of that list, starting at position r.

    Raise ValueError when world_size < 1, length < 0, or rank is not in 0..world_size-1.
    Example: sampler_indices(5, 2, 1, shuffle=False) == [1, 3, 0].
    """
    raise NotImplementedError("l3_sampler_indices: reproduce DistributedSampler's split")


def average_gradients(model: nn.Module, group=None) -> None:
    """Exercise l3_average_gradients: what DDP does to the gradients, by hand.

    Called by every process of `group` (the whole world when None) after backward(), on a
    model that is not wrapped in DDP. Replace each parameter's .grad by the mean of that
    gradient over the processes of the group, in place: all_reduce the sum, then divide by
    the number of processes in the group (dist.get_world_size(group)). Parameters whose .grad
    is None (frozen, or unused in this step) stay None.
    """
    raise NotImplementedError("l3_average_gradients: all_reduce and average every gradient")


def train_ddp(model: nn.Module, dataset, global_batch: int, epochs: int, lr: float,
              seed: int = 0) -> nn.Module:
    """Exercise l3_ddp_step: the one-device training below, turned into DDP.

    Every process of an already started process group calls this with the same arguments
    and a model with the same starting weights. Train so that the result equals, up to float
    rounding, what this one-device loop computes on the whole dataset:

        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        model.train()
        for epoch in range(epochs):
            g = torch.Generator().manual_seed(seed + epoch)
            order = torch.randperm(len(dataset), generator=g).tolist()
            for step in range(len(dataset) // global_batch):
                images, labels = dataset[order[step * global_batch:(step + 1) * global_batch]]
                loss = F.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return model

    Your version: a DistributedSampler over `dataset` (shuffle=True, seed=seed) with
    set_epoch(epoch) every epoch; a DataLoader with each process's share of the global batch
    (per_process_batch above); the model wrapped in DDP (device_ids=[its GPU] only when the
    model is on a GPU); the same optimizer on the DDP model's parameters; exactly
    len(dataset) // global_batch steps per epoch (the sampler pads the dataset to a multiple
    of the world size, so a process's loader can hold one batch more: do not train on it).
    A loop that stops after its steps may let the loader fetch that extra batch, or part of
    it, before stopping: allowed; training on it, or reading any other samples, is not.
    Return the trained model itself, not the DDP wrapper.

    The grader checks the mechanism as well as the result: which samples each process reads
    from `dataset` (only its own share, every epoch; read them in the training process, the
    DataLoader's default num_workers=0) and the all-reduces that average the gradients
    (every step, once).
    """
    raise NotImplementedError("l3_ddp_step: turn the one-device loop into a DDP loop")

