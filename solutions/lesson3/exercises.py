"""Lesson 3 reference solutions (kept out of the student release)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def _require_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def per_process_batch(global_batch: int, world_size: int) -> int:
    _require_count("world_size", world_size)
    _require_count("global_batch", global_batch)
    share, leftover = divmod(global_batch, world_size)
    if share == 0 or leftover:
        raise ValueError(f"a global batch of {global_batch} does not split into {world_size} "
                         f"equal shares; use a multiple of {world_size}")
    return share


def effective_batch(per_process: int, world_size: int, accumulation_steps: int = 1) -> int:
    _require_count("per_process", per_process)
    _require_count("world_size", world_size)
    _require_count("accumulation_steps", accumulation_steps)
    return per_process * world_size * accumulation_steps


def scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    _require_count("base_batch", base_batch)
    _require_count("batch", batch)
    if not base_lr > 0:
        raise ValueError(f"base_lr must be positive, got {base_lr!r}")
    return base_lr * batch / base_batch


def sampler_indices(length: int, world_size: int, rank: int, shuffle: bool = True,
                    seed: int = 0, epoch: int = 0, drop_last: bool = False) -> list[int]:
    _require_count("world_size", world_size)
    _require_count("length", length, minimum=0)
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank!r} is not in 0..{world_size - 1}")
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        order = torch.randperm(length, generator=generator).tolist()
    else:
        order = list(range(length))
    if drop_last and length % world_size:
        per_rank = math.ceil((length - world_size) / world_size)
    else:
        per_rank = math.ceil(length / world_size)
    total = per_rank * world_size
    if drop_last:
        order = order[:total]
    elif total > length:
        repeats = math.ceil(total / length)
        order = (order * repeats)[:total]
    return order[rank:total:world_size]


def average_gradients(model: nn.Module, group=None) -> None:
    size = dist.get_world_size(group)
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)
        param.grad /= size


def train_ddp(model: nn.Module, dataset, global_batch: int, epochs: int, lr: float,
              seed: int = 0) -> nn.Module:
    batch = per_process_batch(global_batch, dist.get_world_size())
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
    device = next(model.parameters()).device
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr, momentum=0.9)
    ddp_model.train()
    steps = len(dataset) // global_batch
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for _, (images, labels) in zip(range(steps), loader, strict=False):
            loss = F.cross_entropy(ddp_model(images.to(device)), labels.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return ddp_model.module
