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
zero_stage_bytes(): the ZeRO paper's flat count for any number of parameters: the model as one
                    tensor, a shard of ceil(N / W), fp32 or mixed precision (2 + 2 + 12 bytes
                    per parameter for Adam), for DDP and ZeRO's three stages.

    python -m ddpcourse.sharding --model 7b --world-size 8    # torch's layouts, then ZeRO's
    python -m ddpcourse.sharding --params 1.3e9 --world-size 16 --precision mixed
    python -m ddpcourse.sharding --zero-paper                 # beside the paper's Figure 1
"""

from __future__ import annotations

import json
import math
import re
import sys

STRATEGIES = ("ddp", "zero", "fsdp")
# Tensors of optimizer state per parameter element: none, the momentum, Adam's two moments.
OPTIMIZER_BUFFERS = {"sgd": 0, "sgd_momentum": 1, "adam": 2}
PARTS = ("params", "grads", "buckets", "optimizer")
GB = 1e9
BYTES_PER_VALUE = 4  # fp32: the lesson's runs and tables
PRECISIONS = ("fp32", "mixed")
# The ZeRO paper's stages and the terms each shards over the W data-parallel ranks.
ZERO_STAGES = {"ddp": (), "zero1": ("optimizer",), "zero2": ("optimizer", "grads"),
               "zero3": ("optimizer", "grads", "params")}
# Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
# (SC 2020, arXiv:1910.02054), Figure 1: GB per GPU for 7.5 B parameters on 64 GPUs, mixed
# precision, Adam (K = 12), as the paper prints them.
ZERO_PAPER_CASE = {"num_params": 7_500_000_000, "world_size": 64, "precision": "mixed",
                   "optimizer": "adam"}
ZERO_PAPER_GB = {"ddp": 120.0, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9}


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


def bytes_per_parameter(precision: str = "fp32", optimizer: str = "adam") -> dict[str, int]:
    """Bytes of each term per parameter, before sharding. fp32: 4, 4, and 4 per optimizer
    buffer. mixed: bf16 weights and gradients, 2 and 2; the optimizer keeps an fp32 master
    copy of the weights beside its fp32 buffers, 4 + 4 per buffer (Adam: 12)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZER_BUFFERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of "
                         f"{', '.join(OPTIMIZER_BUFFERS)}")
    buffers = OPTIMIZER_BUFFERS[optimizer]
    if precision == "mixed":
        return {"params": 2, "grads": 2, "optimizer": 4 + 4 * buffers}
    return {"params": 4, "grads": 4, "optimizer": 4 * buffers}


def zero_stage_bytes(num_params: int, world_size: int, stage: str, precision: str = "fp32",
                     optimizer: str = "adam") -> dict[str, int]:
    """Bytes of params, grads and optimizer state (and their total) on every rank under a
    ZeRO stage ("ddp", "zero1", "zero2", "zero3"), counted as the paper counts: the model one
    flat tensor of num_params values, a sharded term holding ceil(N / W) of them (ZeRO and
    FSDP pad to a multiple of W), an unsharded term all N; no DDP buckets, no activations."""
    if stage not in ZERO_STAGES:
        raise ValueError(f"unknown stage {stage!r}; choose one of {', '.join(ZERO_STAGES)}")
    if num_params < 1 or world_size < 1:
        raise ValueError(f"need at least 1 parameter and 1 rank, got {num_params} and "
                         f"{world_size}")
    per_param = bytes_per_parameter(precision, optimizer)
    shard = -(-num_params // world_size)  # ceil, in integers: exact for any N
    held = {term: per_param[term] * (shard if term in ZERO_STAGES[stage] else num_params)
            for term in ("params", "grads", "optimizer")}
    held["total"] = sum(held.values())
    return held


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
    from ddpcourse.traces import flight_recorder

    return [{"op": entry["profiling_name"].split(":")[-1],
             "elements": sum(math.prod(size) for size in entry["input_sizes"])}
            for entry in flight_recorder()]


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


STAGE_NAMES = {"ddp": ("DDP", "nothing"), "zero1": ("ZeRO-1", "optimizer state"),
               "zero2": ("ZeRO-2", "+ gradients"), "zero3": ("ZeRO-3", "+ weights")}


def gb(n_bytes: float) -> str:
    """GB with one decimal (the paper's 31.4), three digits below 1 GB (0.105, not 0.1)."""
    n = n_bytes / GB
    return f"{n:,.1f}" if n >= 1 else f"{n:.3g}"


def is_zero_paper_case(num_params: int, world_size: int, precision: str,
                       optimizer: str) -> bool:
    return dict(num_params=num_params, world_size=world_size, precision=precision,
                optimizer=optimizer) == ZERO_PAPER_CASE


def stage_table(num_params: int, world_size: int, precision: str = "fp32",
                optimizer: str = "adam") -> list[dict]:
    """One row per ZeRO stage, GB per rank, and the paper's own figure beside it when the case
    is the paper's."""
    paper = is_zero_paper_case(num_params, world_size, precision, optimizer)
    rows = []
    for stage, (name, sharded) in STAGE_NAMES.items():
        held = zero_stage_bytes(num_params, world_size, stage, precision, optimizer)
        row = {"stage": name, "sharded": sharded,
               **{f"{part} GB": gb(held[part]) for part in ("params", "grads", "optimizer")},
               "total GB": gb(held["total"])}
        if paper:
            row["paper GB"] = gb(ZERO_PAPER_GB[stage] * GB)
        rows.append(row)
    return rows


def parameter_count(text: str) -> int:
    """'7.5b' -> 7500000000, '1.3e9', '350m', '125k', '6,738,415,616': for argparse's type=.
    Exact (decimal arithmetic, not floats); a whole, positive number of parameters or a
    one-line error."""
    import argparse
    from decimal import Decimal

    cleaned = str(text).strip().lower().replace(",", "").replace("_", "")
    m = re.fullmatch(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)([kmbt]?)", cleaned)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a parameter count; use e.g. 7.5b, "
                                          "1.3e9, 350m")
    value = Decimal(m.group(1)) * 10 ** {"": 0, "k": 3, "m": 6, "b": 9, "t": 12}[m.group(2)]
    if value < 1 or value > 10**15:
        raise argparse.ArgumentTypeError(f"{text!r}: a model has 1 to 10^15 parameters")
    if value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of parameters")
    return int(value)


def read_records(path) -> list[dict]:
    """The JSON lines lesson8_memory.py --record appended, one per run."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str] | None = None) -> int:
    from ddpcourse.cli import ArgumentParser
    from ddpcourse.report import format_table

    parser = ArgumentParser(description="Bytes of model state per rank: for a model of known "
                                        "shape under torch's DDP, ZeroRedundancyOptimizer and "
                                        "FSDP2, and for any parameter count under DDP and "
                                        "ZeRO's three stages, as the ZeRO paper counts")
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--model", choices=sorted(MODELS),
                       help="a decoder's shapes (default 7b): torch's layouts, then ZeRO's")
    model.add_argument("--params", type=parameter_count, metavar="COUNT",
                       help="any number of parameters (7.5b, 1.3e9, 350m): ZeRO's stages only")
    model.add_argument("--zero-paper", action="store_true",
                       help="the ZeRO paper's Figure 1: --params 7.5b --world-size 64 "
                            "--precision mixed --optimizer adam (options given change it)")
    parser.add_argument("--world-size", type=int, help="ranks (default 8)")
    parser.add_argument("--precision", choices=PRECISIONS,
                        help="fp32 (default) or mixed: bf16 weights and gradients, fp32 master "
                             "weights in the optimizer")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZER_BUFFERS), help="default adam")
    args = parser.parse_args(argv)
    defaults = ZERO_PAPER_CASE if args.zero_paper else {"world_size": 8, "precision": "fp32",
                                                        "optimizer": "adam"}
    world_size, precision, optimizer = (
        defaults[key] if getattr(args, key) is None else getattr(args, key)
        for key in ("world_size", "precision", "optimizer"))
    shapes = None if args.params or args.zero_paper else MODELS[args.model or "7b"]()
    limit = 4096 if shapes else 1_000_000  # the layouts' table visits every rank
    if not 1 <= world_size <= limit:
        parser.error(f"--world-size must be between 1 and {limit:,}"
                     + (" with a model's shapes" if shapes else ""))

    if shapes:
        count = sum(math.prod(s) for s in shapes)
        print(f"{args.model or '7b'}: {count / 1e9:.2f} B parameters in {len(shapes)} tensors, "
              f"fp32, {optimizer}, {world_size} ranks; the most loaded rank holds:")
        print(format_table(plan_table(shapes, world_size, optimizer)))
        print("(between steps; buckets: DDP's copy of the gradients, gone with "
              "gradient_as_bucket_view=True; activations and FSDP's gathered layers come on top)")
        if precision == "mixed":
            print("(torch's layouts in fp32 all the same: autocast and FSDP2's "
                  "MixedPrecisionPolicy keep the weights, gradients and state in fp32 between "
                  "steps and cast copies while computing)")
        print()
    else:
        count = ZERO_PAPER_CASE["num_params"] if args.zero_paper else args.params
    per_param = bytes_per_parameter(precision, optimizer)
    terms = " + ".join(str(per_param[t]) for t in ("params", "grads", "optimizer"))
    kind = ("bf16 weights and gradients; fp32 master weights and state" if precision == "mixed"
            else "weights, gradients and state")
    print(f"ZeRO's stages: {count:,} parameters on {world_size} ranks, counted flat (one "
          f"tensor, shards of ceil(N / W));\n{precision} ({kind}), {optimizer}: {terms} bytes "
          f"per parameter; each rank holds:")
    print(format_table(stage_table(count, world_size, precision, optimizer)))
    if is_zero_paper_case(count, world_size, precision, optimizer):
        print("paper GB: Rajbhandari et al., ZeRO (SC 2020, arXiv:1910.02054), Figure 1: "
              "7.5 B parameters, 64 GPUs, K = 12")
    print("(no DDP buckets, no activations: the paper's count; GB = 10^9 bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
