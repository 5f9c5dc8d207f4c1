"""Lesson 10 experiment: sequence parallelism: tensor parallelism whose LayerNorms and residual
adds work on a slice of the sequence each, equal to one process, with all_gather and
reduce_scatter in place of all_reduce, and the activation memory it saves, measured.

    make lesson10-sp NPROC=4                            # prints, then runs, this command:
    torchrun --nproc-per-node=4 scripts/experiments/lesson10_sequence_parallel.py

Tensor parallelism (lesson 8) splits the linear layers, but between two split pairs every rank
holds the whole activation, batch x seq x features, and runs the same LayerNorm and residual
add on it: W copies of the same numbers, each kept for backward. Sequence parallelism (Korthikanti
et al., "Reducing Activation Recomputation in Large Transformer Models") cuts that region along
the sequence: rank r keeps tokens r S/W to (r + 1) S/W - 1 (Shard(1)). The all_reduce that
ended a row-split linear becomes a reduce_scatter (each rank receives the sum for its tokens
only), and the column-split linear that follows gathers the tokens again (an all_gather):
an all_reduce is exactly a reduce_scatter then an all_gather, so the traffic is the same.
In torch it is three parallel styles (torch/distributed/tensor/parallel/style.py):
    norm  SequenceParallel()                    input and output Shard(1)
    up    ColwiseParallel(input_layouts=Shard(1))   all_gather to Replicate before it
    down  RowwiseParallel(output_layouts=Shard(1))  reduce_scatter of its partial sums
The blocks of the 2-D experiment (make lesson10-two-d) run three ways on one batch: in one
process, under plain tensor parallelism, and with sequence parallelism. Compared with the one
process: the output, the input's gradient and every parameter's gradient. Counted (the 2-D
experiment's dispatch mode): every collective of a forward and backward. Measured: the bytes of
the tensors autograd saves for backward (torch.autograd.graph.saved_tensors_hooks), each
storage once, parameters left out, beside a prediction from the shapes.
"""

import copy
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import (
    end_with_rank_0s_verdict,
    fail,
    pick_device,
    world_of_one_unless_launched,
)
from ddpcourse.scripts import import_script

mesh_groups = import_script("experiments/lesson10_mesh", "mesh_groups")
Stack, Collectives, by_dimension, FLOAT_BYTES = import_script(
    "experiments/lesson10_two_d", "Stack", "Collectives", "by_dimension", "FLOAT_BYTES")

PLANS = {
    "tensor parallel": {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()},
    "sequence parallel": {
        "blocks.*.norm": SequenceParallel(),
        "blocks.*.up": ColwiseParallel(input_layouts=Shard(1)),
        "blocks.*.down": RowwiseParallel(output_layouts=Shard(1)),
        "norm": SequenceParallel(use_local_output=True),  # the output: this rank's tokens
    },
}


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--features", type=int, default=16, help="a token's features")
    parser.add_argument("--hidden", type=int, default=120, help="features inside a block")
    parser.add_argument("--seq", type=int, default=60,
                        help="tokens per sample (60 splits over 1, 2, 3, 4, 5 and 6 ranks)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest difference from one process that counts as equal")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if min(args.blocks, args.features, args.hidden, args.seq, args.batch_size) < 1:
        parser.error("--blocks, --features, --hidden, --seq and --batch-size must be at least 1")
    return args


class SavedBytes:
    """Inside `with SavedBytes(model) as saved:`, saved.bytes adds up the storages of the
    tensors autograd keeps for backward, each once (a view saves no new memory), a DTensor's
    by its local piece, the model's parameters left out (they are kept anyway)."""

    def __init__(self, model):
        self.parameters = {self.storage(p).data_ptr() for p in model.parameters()}
        self.seen, self.bytes = set(), 0
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    @staticmethod
    @torch.no_grad()
    def storage(t):
        return (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()

    def pack(self, t):
        storage = self.storage(t)
        if storage.data_ptr() not in self.parameters | self.seen:
            self.seen.add(storage.data_ptr())
            self.bytes += storage.nbytes()
        return t

    def __enter__(self):
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


def predicted_saved(args, tp: int, sequence_parallel: bool) -> int:
    """Bytes autograd keeps per rank. Per block: the norm's input and its mean and 1/std
    (one number per token each); up's input (the norm's output); gelu's input and down's input
    (hidden / tp features per token each). Then the final norm: its input and statistics.
    Sequence parallelism divides the norms' part by tp; up's input is all-gathered first, and
    torch saves the gathered tensor, whole."""
    tokens = args.batch_size * args.seq
    whole = tokens * args.features
    norm = whole + 2 * tokens  # input, mean, 1/std
    if sequence_parallel:
        norm //= tp
    per_block = norm + whole + 2 * tokens * (args.hidden // tp)
    return (args.blocks * per_block + norm) * FLOAT_BYTES


def predicted_collectives(args, tp: int, sequence_parallel: bool) -> dict:
    """{(kind, "tp"): [count, bytes, why]} of a forward and backward, from the shapes."""
    whole = args.batch_size * args.seq * args.features * FLOAT_BYTES
    blocks = args.blocks
    if tp == 1:
        return {}
    if not sequence_parallel:
        return {("all_reduce", "tp"): [2 * blocks, 2 * blocks * whole,
                                       "per block: down's output, up's input gradient"]}
    norms = blocks + 1
    return {("all_gather", "tp"): [2 * blocks, 2 * blocks * whole,
                                   "per block: up's input forward, down's output gradient"],
            ("reduce_scatter", "tp"): [2 * blocks, 2 * blocks * whole,
                                       "per block: down's output forward, up's input gradient"],
            ("all_reduce", "tp"): [2 * norms, 2 * norms * args.features * FLOAT_BYTES,
                                   "the norms' Partial gradients, weight and bias, made whole"]}


def run(model, x, target, tokens: slice, total: int, groups: dict):
    """Forward and backward on this rank's tokens; (output, input gradient, collectives,
    saved bytes)."""
    x = x[:, tokens].clone().requires_grad_()
    with Collectives(groups) as seen:
        with SavedBytes(model) as saved:
            y = model(x)
        # Sum of squares over this rank's tokens / all numbers: the ranks' losses add up to
        # the mean over the whole output, so each rank's gradient is the true one.
        loss = (y - target[:, tokens]).pow(2).sum() / total
        loss.backward()
        # Each rank's norm weight and bias gradient covers its own tokens only: DTensor leaves
        # it Partial(sum) after backward, with no collective. A step needs it whole, so the
        # all_reduce belongs to the step (FSDP2 would do it before its reduce_scatter).
        for p in model.parameters():
            if isinstance(p.grad, DTensor) and any(isinstance(q, Partial)
                                                   for q in p.grad.placements):
                p.grad = p.grad.redistribute(placements=[Replicate()])
    return y.detach(), x.grad, seen.calls, saved.bytes


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    tp = world_size  # one mesh dimension, all ranks: tensor and sequence parallel together
    for what, value in (("--seq", args.seq), ("--hidden", args.hidden)):
        if value % tp:
            fail(f"{what} {value} does not split evenly over {tp} ranks; use a multiple of {tp}")
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=args.timeout)
    dist.init_process_group(backend, timeout=timeout)
    mesh = init_device_mesh(device.type, (tp,), mesh_dim_names=("tp",),
                            backend_override=mesh_groups(("tp",), backend, timeout))
    groups = {"tp": mesh.get_group("tp")}

    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.batch_size, args.seq, args.features)
    x = torch.randn(shape, generator=generator).to(device)  # the same batch on every rank
    target = torch.randn(shape, generator=generator).to(device)
    torch.manual_seed(args.seed)
    reference = Stack(args.blocks, args.features, args.hidden).to(device)
    every_token, total = slice(None), x.numel()
    expected = run(reference, x, target, every_token, total, groups)
    expected_grads = [p.grad for p in reference.parameters()]

    share = args.seq // tp
    mine = slice(rank * share, (rank + 1) * share)
    rows, measured, differences = [], {}, {}
    for setup, plan in PLANS.items():
        sequence_parallel = setup == "sequence parallel"
        model = parallelize_module(copy.deepcopy(reference), mesh, plan)
        model.zero_grad(set_to_none=True)
        tokens = mine if sequence_parallel else every_token
        y, x_grad, calls, saved = run(model, x, target, tokens, total, groups)
        grads = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                 for p in model.parameters()]  # collectives, after the count
        differences[setup] = {
            "output": (y - expected[0][:, tokens]).abs().max().item(),
            "input grad": (x_grad - expected[1][:, tokens]).abs().max().item(),
            "parameter grads": max((g - e).abs().max().item()
                                   for g, e in zip(grads, expected_grads, strict=True))}
        measured[setup] = (by_dimension(calls), saved)

    every = [None] * world_size if rank == 0 else None
    dist.gather_object((differences, measured), every, dst=0)
    worst, agree = 0.0, True
    if rank == 0:
        print(f"{world_size} ranks on {device.type} with {backend}, one mesh dimension ('tp'); "
              f"{args.blocks} blocks ({args.features} -> {args.hidden} -> {args.features}), "
              f"batch {args.batch_size} x {args.seq} tokens, the same on every rank "
              f"(sequence parallel: {share} tokens each)")
        table = []
        for setup in PLANS:
            sequence_parallel = setup == "sequence parallel"
            found = {k: max(d[setup][k] for d, _ in every) for k in every[0][0][setup]}
            worst = max(worst, *found.values())
            print(f"{setup}: largest difference from one process: "
                  + ", ".join(f"{k} {v:.1e}" for k, v in found.items()))
            predicted = predicted_collectives(args, tp, sequence_parallel)
            seen = every[0][1][setup][0]
            alike = all(m[setup][0] == seen for _, m in every)
            for key in sorted(set(predicted) | set(seen)):
                want = predicted.get(key, [0, 0, "not predicted"])
                got = seen.get(key, [0, 0])
                same = want[:2] == got and alike
                agree &= same
                rows.append({"setup": setup, "collective": key[0], "dimension": key[1],
                             "predicted": want[0], "measured": got[0],
                             "predicted bytes": want[1], "measured bytes": got[1],
                             "check": "same" if same else "DIFFERENT", "why": want[2]})
            saved = [m[setup][1] for _, m in every]
            want = predicted_saved(args, tp, sequence_parallel)
            same = saved == [want] * world_size
            agree &= same
            table.append({"setup": setup, "saved bytes per rank": ",".join(map(str, saved)),
                          "predicted": want, "check": "same" if same else "DIFFERENT"})
        print("\ncollectives of one forward and backward, per rank (bytes: the whole tensor)")
        print(format_table(rows))
        print("\nactivations saved for backward, per rank (rank 0, 1, ...)")
        print(format_table(table))
        plain, split = (predicted_saved(args, tp, s) for s in (False, True))
        kept = [m["tensor parallel"][1] - m["sequence parallel"][1] for _, m in every]
        # The paper's scheme keeps only this rank's tokens of up's input too, and gathers them
        # again in backward: tp - 1 of every tp of those bytes saved as well.
        gathered = args.blocks * args.batch_size * args.seq * args.features * FLOAT_BYTES
        print(f"saved by sequence parallelism: {kept[0]} bytes per rank measured, {plain - split} "
              f"predicted ({100 * kept[0] / max(plain, 1):.0f} % of plain tensor parallel's); "
              f"saving up's gathered input too, as the paper does, would save "
              f"{gathered - gathered // tp} more")
        same = worst <= args.tolerance
        print(f"check: both {'equal' if same else 'DO NOT equal'} one process (largest "
              f"difference {worst:.1e}, tolerance {args.tolerance:g}); collectives and memory "
              f"{'as predicted' if agree else 'NOT as predicted'}")
        print(summary_line(world_size=world_size, max_diff=worst, same_as_one_process=same,
                           as_predicted=agree,
                           saved_bytes_tp=every[0][1]["tensor parallel"][1],
                           saved_bytes_sp=every[0][1]["sequence parallel"][1],
                           memory_saved=kept[0], predicted_saving=plain - split,
                           backend=backend,
                           wall_s=round(time.perf_counter() - started, 2)))
    end_with_rank_0s_verdict(rank == 0 and (worst > args.tolerance or not agree), device)


if __name__ == "__main__":
    main()
