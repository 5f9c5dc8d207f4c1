"""Lesson 8 reference solutions (see lessons/lesson8/exercises.py for the tasks)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
OPTIMIZERS = ("sgd", "sgd_momentum", "adam")

# --- l8_memory_calculator ------------------------------------------------------------------

BUFFERS = {"sgd": 0, "sgd_momentum": 1, "adam": 2}   # fp32 tensors the optimizer keeps
SHARDED = {"ddp": (), "zero1": ("optimizer",), "zero2": ("optimizer", "grads"),
           "zero3": ("optimizer", "grads", "params"), "fsdp": ("optimizer", "grads", "params")}


def bytes_per_rank(num_params: int, world_size: int, strategy: str, optimizer: str = "adam",
                   mixed_precision: bool = False) -> dict[str, int]:
    if num_params < 1 or world_size < 1:
        raise ValueError(f"need num_params >= 1 and world_size >= 1, got {num_params} and "
                         f"{world_size}")
    if strategy not in SHARDED:
        raise ValueError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if optimizer not in BUFFERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
    if mixed_precision:  # bf16 weights and grads; the fp32 master weights ride with the state
        per_param = {"params": 2, "grads": 2, "optimizer": 4 + 4 * BUFFERS[optimizer]}
    else:
        per_param = {"params": 4, "grads": 4, "optimizer": 4 * BUFFERS[optimizer]}
    shard = -(-num_params // world_size)  # padded to a multiple of W: every rank the same
    held = {term: per_param[term] * (shard if term in SHARDED[strategy] else num_params)
            for term in ("params", "grads", "optimizer")}
    held["total"] = sum(held.values())
    return held


# --- l8_zero1_optimizer --------------------------------------------------------------------

class Zero1Optimizer:
    def __init__(self, params, optimizer_class, group=None, **defaults):
        self.group = group
        self.params = list(params)
        world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        # Largest first, each to the rank holding the fewest elements so far.
        held = [0] * world
        self.owners = [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            owner = held.index(min(held))
            self.owners[i] = owner
            held[owner] += self.params[i].numel()
        mine = [p for p, owner in zip(self.params, self.owners, strict=True)
                if owner == self.rank]
        self.optimizer = optimizer_class(mine, **defaults) if mine else None

    def step(self) -> None:
        if self.optimizer is not None:
            self.optimizer.step()  # only this rank's shard: its state exists nowhere else
        with torch.no_grad():
            for p, owner in zip(self.params, self.owners, strict=True):
                dist.broadcast(p.data, group_src=owner, group=self.group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()


# --- l8_pipeline_step ----------------------------------------------------------------------

def check_pipeline_arguments(batch: torch.Tensor, num_micro_batches: int, group) -> None:
    """Refuse what cannot be piped before anything runs or is sent: the other stage, which
    makes the same checks, refuses too, so neither waits for a message that never comes."""
    if dist.get_world_size(group) != 2:
        raise ValueError(f"a two-stage pipeline needs a group of 2 ranks, this one has "
                         f"{dist.get_world_size(group)}")
    if num_micro_batches < 1 or len(batch) % num_micro_batches:
        raise ValueError(f"a batch of {len(batch)} does not split into {num_micro_batches} "
                         "equal micro-batches")


def pipeline_step(stage: nn.Module, batch: torch.Tensor, num_micro_batches: int,
                  activation_shape: tuple[int, ...], loss_fn=F.cross_entropy,
                  group=None) -> torch.Tensor | None:
    check_pipeline_arguments(batch, num_micro_batches, group)
    me = dist.get_rank(group)
    peer = 1 - me
    micro_batches = batch.chunk(num_micro_batches)
    if me == 0:
        outputs = []
        for x in micro_batches:                          # all forwards
            out = stage(x)
            dist.send(out.detach().contiguous(), group_dst=peer, group=group)
            outputs.append(out)
        for out in reversed(outputs):                    # then all backwards
            grad = torch.empty(activation_shape, dtype=out.dtype)
            dist.recv(grad, group_src=peer, group=group)
            out.backward(grad)
        return None
    received, losses = [], []
    for targets in micro_batches:                        # all forwards
        activation = torch.empty(activation_shape)
        dist.recv(activation, group_src=peer, group=group)
        activation.requires_grad_()
        received.append(activation)
        losses.append(loss_fn(stage(activation), targets))
    for activation, loss in zip(reversed(received), reversed(losses), strict=True):
        (loss / num_micro_batches).backward()            # equal micro-batches: the batch mean
        dist.send(activation.grad, group_dst=peer, group=group)
    return torch.stack([loss.detach() for loss in losses]).mean()
