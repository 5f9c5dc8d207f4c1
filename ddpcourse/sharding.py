"""What one rank holds, and what a step sends, under DDP, ZeRO-1 and FSDP2 (lesson 8).

predict():          the bytes of weights, gradients, gradient buckets and optimizer state on
                    every rank, from the model's parameter shapes, laid out the way each torch
                    tool lays them:
                    "ddp"  DistributedDataParallel: everything whole on every rank, and with
                           its default gradient_as_bucket_view=False a second copy of the
                           gradients in its communication buckets;
                    "zero" ZeroRedundancyOptimizer inside DDP: DDP's weights, gradients and
                           buckets; whole parameters dealt to ranks, largest first, to the rank
                           with the fewest elements so far; a rank keeps optimizer state for
                           its own parameters only;
                    "fsdp" fully_shard: each parameter cut along its first dimension
                           (torch.chunk into W pieces); weights and gradients padded so every
                           rank's piece has ceil(rows / W) rows, optimizer state unpadded.
held_bytes():       weights, gradients and optimizer state measured on a live rank: the bytes
                    of the distinct storages they really occupy (DDP's buckets are not
                    parameters' storages: scripts/experiments/lesson8_memory.py adds them).
collectives():      the collectives this process started, read from torch's flight recorder.

    python -m ddpcourse.sharding --model 7b --world-size 8    # the table for a 7B model
"""

from __future__ import annotations

import json
import math
import sys

STRATEGIES = ("ddp", "zero", "fsdp")
# Tensors of optimizer state per parameter element: none, the momentum, Adam's two moments.
OPTIMIZER_BUFFERS = {"sgd": 0, "sgd_momentum": 1, "adam": 2}
PARTS = ("params", "grads", "buckets", "optimizer")
GB = 1e9
BYTES_PER_VALUE = 4  # fp32: the lesson's runs and tables


def zero_owners(numels: list[int], world_size: int) -> list[int]:
    """The rank that steps each parameter under ZeroRedundancyOptimizer: largest first, each to
    the rank holding the fewest elements so far, the lowest such rank on a tie (the partition of
    torch/distributed/optim/zero_redundancy_optimizer.py, _partition_parameters)."""
    owners = [0] * len(numels)
    held = [0] * world_size
    for index in sorted(range(len(numels)), key=lambda i: -numels[i]):  # stable: ties in order
        rank = held.index(min(held))
        owners[index] = rank
        held[rank] += numels[index]
    return owners


def fsdp_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """(rows this rank owns, rows its padded piece holds) of a parameter with `rows` rows:
    torch.chunk's pieces of ceil(rows / W), the last ones shorter or empty, padded to full."""
    per_rank = math.ceil(rows / world_size)
    return max(0, min(per_rank, rows - rank * per_rank)), per_rank


def predict(shapes: list[tuple[int, ...]], world_size: int, strategy: str,
            optimizer: str = "adam") -> list[dict[str, int]]:
    """Bytes of params, grads, buckets and optimizer state (and their total) on each rank, a
    list of `world_size` dicts, for a model whose parameters have these shapes, between two
    steps (activations and short-lived buffers, such as a gathered layer, are not counted).
    DDP's buckets (ddp, zero) last from step to step: a copy of the gradients, the buffers its
    all-reduces run on. gradient_as_bucket_view=True makes the gradients views into them,
    which saves that copy; here the default, False, is counted."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if optimizer not in OPTIMIZER_BUFFERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of "
                         f"{', '.join(OPTIMIZER_BUFFERS)}")
    if world_size < 1 or not shapes:
        raise ValueError("need a world size of at least 1 and at least one parameter")
    buffers = OPTIMIZER_BUFFERS[optimizer]
    numels = [math.prod(shape) for shape in shapes]
    if strategy == "zero":
        owners = zero_owners(numels, world_size)
    ranks = []
    for rank in range(world_size):
        if strategy == "ddp":
            weights = state = sum(numels)
        elif strategy == "zero":
            weights = sum(numels)
            state = sum(n for n, owner in zip(numels, owners, strict=True) if owner == rank)
        else:
            weights = state = 0
            for shape, numel in zip(shapes, numels, strict=True):
                rows = shape[0] if shape else 1
                owned, padded = fsdp_rows(rows, world_size, rank)
                weights += padded * (numel // max(rows, 1))
                state += owned * (numel // max(rows, 1))
        held = {"params": weights * BYTES_PER_VALUE, "grads": weights * BYTES_PER_VALUE,
                "buckets": weights * BYTES_PER_VALUE if strategy != "fsdp" else 0,
                "optimizer": buffers * state * BYTES_PER_VALUE}
        held["total"] = sum(held.values())
        ranks.append(held)
    return ranks


def shapes_of(model) -> list[tuple[int, ...]]:
    """The shapes of a model's parameters (whole, even when it is sharded already)."""
    return [tuple(p.shape) for p in model.parameters()]


def transformer_shapes(layers: int = 32, width: int = 4096, ffn: int = 11008,
                       vocab: int = 32000, kv_width: int | None = None) -> list[tuple[int, ...]]:
    """The parameter shapes of a Llama-style decoder; the defaults are a 7B model (6.74 B):
    per layer the attention's query, key, value and output matrices (keys and values
    kv_width x width, narrower with grouped-query attention), three width x ffn MLP matrices
    and two norm vectors; the embedding, a final norm and the output matrix."""
    kv = kv_width or width
    attention = [(width, width), (kv, width), (kv, width), (width, width)]
    block = attention + [(ffn, width), (ffn, width), (width, ffn)] + [(width,)] * 2
    return [(vocab, width)] + block * layers + [(width,), (vocab, width)]


MODELS = {"7b": lambda: transformer_shapes(), "13b": lambda: transformer_shapes(40, 5120, 13824),
          "70b": lambda: transformer_shapes(80, 8192, 28672, kv_width=1024)}


def blocks(model) -> list:
    """The repeated blocks of a timm model (ResNet's layer1..4, ViT's blocks, ConvNeXt's
    stages), in order: the units FSDP shards one at a time. [] for a model without them."""
    import re

    found = []
    for name, child in model.named_children():
        if re.fullmatch(r"layer\d+|blocks|stages", name):
            found.extend(child.children())
    return found


def fingerprint(state_dict: dict) -> str:
    """16 hex digits of SHA-256 over a state dict's names and values (bit for bit): two
    state dicts with the same fingerprint hold the same tensors."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name in sorted(state_dict):
        value = _local(state_dict[name]).detach().cpu().contiguous().reshape(-1)
        digest.update(name.encode())
        digest.update(value.view(torch.uint8).numpy().tobytes())  # the bits, any dtype
    return digest.hexdigest()[:16]


# --- measured --------------------------------------------------------------------------------

def _local(tensor):
    """The part of a tensor this process holds: a DTensor's local shard, else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages under `tensors`: views of one buffer count once."""
    storages = {}
    for tensor in tensors:
        storage = _local(tensor).untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def held_bytes(model, optimizer) -> dict[str, int]:
    """The bytes this rank really holds for the model's weights, their gradients and the
    optimizer's state (ZeroRedundancyOptimizer's is in its .optim), counted by storage."""
    params = list(model.parameters())
    inner = getattr(optimizer, "optim", optimizer)
    state = [value for per_param in inner.state.values() for value in per_param.values()
             if hasattr(value, "untyped_storage")]
    held = {"params": _storage_bytes(params),
            "grads": _storage_bytes(p.grad for p in params if p.grad is not None),
            "optimizer": _storage_bytes(state)}
    held["total"] = sum(held.values())
    return held


def collectives() -> list[dict]:
    """Every collective this process started so far that torch's flight recorder kept (its
    buffer holds TORCH_FR_BUFFER_SIZE entries, a variable read when the first process group
    is created): one dict each, with the op's name, e.g. "all_gather", and `elements`, the
    number of values it was given."""
    import pickle

    from torch._C._distributed_c10d import _dump_fr_trace

    trace = pickle.loads(_dump_fr_trace(includeCollectives=True, includeStackTraces=False,
                                        onlyActive=False))
    return [{"op": entry["profiling_name"].split(":")[-1],
             "elements": sum(math.prod(size) for size in entry["input_sizes"])}
            for entry in trace.get("entries", [])]


def count_collectives(entries: list[dict]) -> str:
    """'all_gather x9 (747,316 values), all_reduce x5 (...)': one line for a list of them."""
    counted: dict[str, list[int]] = {}
    for entry in entries:
        seen = counted.setdefault(entry["op"], [0, 0])
        seen[0] += 1
        seen[1] += entry["elements"]
    return ", ".join(f"{op} x{n} ({values:,} values)" for op, (n, values) in
                     sorted(counted.items())) or "none"


# --- a table -------------------------------------------------------------------------------

def mb(n: float) -> str:
    return f"{n / 1e6:.3f}"


def plan_table(shapes, world_size: int, optimizer: str = "adam") -> list[dict]:
    """One row per strategy: what its most loaded rank holds, in GB."""
    rows = []
    for strategy in STRATEGIES:
        worst = max(predict(shapes, world_size, strategy, optimizer),
                    key=lambda held: held["total"])
        sizes = {f"{part} GB": f"{worst[part] / GB:,.2f}" for part in (*PARTS, "total")}
        rows.append({"strategy": strategy, **sizes})
    return rows


def read_records(path) -> list[dict]:
    """The JSON lines lesson8_memory.py --record appended, one per run."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str] | None = None) -> int:
    from ddpcourse.cli import ArgumentParser
    from ddpcourse.report import format_table

    parser = ArgumentParser(description="Bytes of model state per rank under DDP, ZeRO-1 "
                                        "(ZeroRedundancyOptimizer) and FSDP2, for a model of "
                                        "known shape")
    parser.add_argument("--model", choices=sorted(MODELS), default="7b")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZER_BUFFERS), default="adam")
    args = parser.parse_args(argv)
    if not 1 <= args.world_size <= 4096:
        parser.error("--world-size must be between 1 and 4096")
    shapes = MODELS[args.model]()
    count = sum(math.prod(s) for s in shapes)
    print(f"{args.model}: {count / 1e9:.2f} B parameters in {len(shapes)} tensors, fp32, "
          f"{args.optimizer}, {args.world_size} ranks; the most loaded rank holds:")
    print(format_table(plan_table(shapes, args.world_size, args.optimizer)))
    print("(between steps; buckets: DDP's copy of the gradients, gone with "
          "gradient_as_bucket_view=True; activations and FSDP's gathered layers come on top)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
