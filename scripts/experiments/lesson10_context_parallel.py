"""Lesson 10 experiment: torch's own context parallelism (`context_parallel`, a prototype) tried
case by case: what it does here, beside attention in one process on the whole sequence.

    make lesson10-cp NPROC=2                            # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/experiments/lesson10_context_parallel.py

torch.distributed.tensor.experimental.context_parallel(mesh, buffers=..., buffer_seq_dims=...)
cuts its buffers along the sequence over a 1-D device mesh (in place, restored on exit; where
the length splits in 2W chunks rank r keeps chunks r and 2W - 1 - r, torch's head-tail load
balancer) and, while it is open, swaps F.scaled_dot_product_attention for a version that makes
DTensors of the shards: attention's kernels then reach torch's ring (`_sdpa_handler`), which
covers the flash, memory-efficient and cuDNN kernels and their backwards only. Each case below
runs F.scaled_dot_product_attention inside it on seeded Q, K, V (batch, heads, sequence, head
dim; sequence dimension 2) and catches what it raises, a finding, not a failure: causal and
full (no mask) forward, then forward and backward. The buffers are Q, K, V, the gradient that
backward starts from and the positions 0..S-1, so that each rank's block is put back in order
and compared with scaled_dot_product_attention on the whole sequence in one process, as
the ring attention experiment (make lesson10-ring) compares (the largest |difference|). torch's
counter of collectives, CommDebugMode (torch.distributed.tensor.debug), counts those each case
ran (not send or recv, which torch's ring does not use: it rotates K and V by all-gather or
all-to-all). The cases run under the rotate method as it stands (torch's default) and again
after set_rotate_method("alltoall").

On the CPU (gloo) SDPA calls a kernel of its own, _scaled_dot_product_flash_attention_for_cpu,
which has no such handler: DTensor then looks for a sharding through the kernel's
decomposition (torch/distributed/tensor/_decompositions.py), slowly the first time, and what
it finds, or raises, is what this run shows ("s, rank 0": each case's seconds). On a GPU with
nccl (pick_device) the script runs unchanged, float32 takes the memory-efficient kernel, and
every case is expected to work, K and V rotating by all-gather or all-to-all: an expectation
from torch's source, not a measurement (no GPU was lent when this was written).

Every case gets a process group of its own, with a timeout: should one rank raise where
another waits in a collective, the waiting one gives up after --timeout seconds and the next
case starts on a fresh group; each case's outcome on every rank is then gathered on the world
group (whose timeout is 5 times as long), so no rank waits forever and a case that ended
differently on different ranks says so. Runs at any W (W = 1: a mesh of one rank).
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.experimental import context_parallel

# the rotate method in force and its setter live in the prototype's private module only
from torch.distributed.tensor.experimental._context_parallel._attention import (
    _cp_options,
    set_rotate_method,
)

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched

# (name, causal, backward): causal backward tells something only where causal forward works
CASES = [("causal forward", True, False), ("full forward", False, False),
         ("full forward+backward", False, True), ("causal forward+backward", True, True)]
WORLD_TIMEOUTS = 5  # the world group's timeout, in case timeouts
SHORT = {"causal forward": "causal_fwd", "full forward": "full_fwd",
         "full forward+backward": "full_fwd_bwd", "causal forward+backward": "causal_fwd_bwd"}


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=120,
                        help="positions in the sequence; a multiple of 2W (120 fits 1 to 6 "
                             "ranks), so that torch's head-tail load balancer is in force")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest difference from attention in one process that counts as "
                             "equal")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective of a case may wait for the other processes "
                             f"(the world group's: {WORLD_TIMEOUTS} times that)")
    args = parser.parse_args()
    if min(args.seq_len, args.batch_size, args.heads, args.head_dim) < 1:
        parser.error("--seq-len, --batch-size, --heads and --head-dim must be at least 1")
    return args


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def run_case(mesh, tensors, causal: bool, backward: bool):
    """One case on this rank: (outcome, collectives counted, positions held, local results:
    the output block and, with backward, the gradients of Q, K and V)."""
    q, k, v, grad = (t.clone() for t in tensors)  # context_parallel cuts its buffers in place
    seq_len = q.shape[2]
    positions = torch.arange(seq_len, device=q.device).view(1, 1, seq_len, 1)
    held, results, comm = None, None, CommDebugMode()
    try:
        with context_parallel(mesh, buffers=[q, k, v, grad, positions],
                              buffer_seq_dims=[2, 2, 2, 2, 2]):
            held = positions.flatten().tolist()
            with comm:
                if backward:
                    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                    out.backward(grad)
                    results = [out.detach(), *(t.grad for t in leaves)]
                else:
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    results = [out.detach()]
        outcome = "ok"
    except Exception as error:  # torch's, reported as found
        outcome = first_line(error)
    counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items() if n}
    collectives = ", ".join(f"{name} x{n}" for name, n in sorted(counts.items())) or "none"
    return outcome, collectives, held, results


def in_order(block, order: list[int]):
    """Every rank's block gathered (world group) and put back in sequence order: `order` is
    the positions the ranks held, rank 0's first."""
    blocks = [torch.empty_like(block) for _ in range(dist.get_world_size())]
    dist.all_gather(blocks, block.contiguous())
    gathered = torch.cat(blocks, dim=2)
    whole = torch.empty_like(gathered)
    whole[:, :, torch.tensor(order, device=block.device)] = gathered
    return whole


def method_name(method) -> str:
    """_RotateMethod.ALL_GATHER -> 'allgather', as set_rotate_method spells it."""
    return method.name.lower().replace("_", "")


def spans(positions: list[int]) -> str:
    """[0, 1, 2, 9, 10] -> '0-2,9-10'."""
    runs, start = [], positions[0]
    for before, after in zip(positions, positions[1:] + [None], strict=True):
        if after != before + 1:
            runs.append(f"{start}-{before}" if start != before else str(start))
            start = after
    return ",".join(runs)


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if args.seq_len % (2 * world_size):
        fail(f"--seq-len {args.seq_len} does not split into {2 * world_size} equal chunks (2W, "
             f"torch's load balancing); use a multiple of {2 * world_size}")
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=args.timeout)
    # the world group gathers each case's outcome: it waits for a rank stuck in a case's
    # collective (up to --timeout) and for that rank's own work before it, so longer
    dist.init_process_group(backend, timeout=WORLD_TIMEOUTS * timeout)
    rank = dist.get_rank()

    shape = (args.batch_size, args.heads, args.seq_len, args.head_dim)
    generator = torch.Generator().manual_seed(args.seed)
    tensors = [torch.randn(shape, generator=generator).to(device) for _ in range(4)]
    default_method = method_name(_cp_options.rotate_method)  # before anything sets it

    rows, short, worst, layout = [], {}, 0.0, ""
    for method in (None, "alltoall"):  # torch's default first
        if method is not None:
            set_rotate_method(method)
        for name, causal, backward in CASES:
            # a fresh group each case, with its timeout (from_group keeps it; init_device_mesh
            # over the whole world would reuse the world group): one a failed case left half
            # way through a collective would pair the next case's collectives wrongly
            mesh = DeviceMesh.from_group(dist.new_group(timeout=timeout), device.type)
            in_force = method_name(_cp_options.rotate_method)
            case_started = time.perf_counter()
            outcome, collectives, held, results = run_case(mesh, tensors, causal, backward)
            seconds = time.perf_counter() - case_started
            everyone = [None] * world_size
            dist.all_gather_object(everyone, (outcome, collectives, held))
            outcomes = [o for o, _, _ in everyone]
            diff = None
            if all(o == "ok" for o in outcomes):  # every rank has its blocks: compare
                order = [p for _, _, h in everyone for p in h]
                found = [in_order(t, order) for t in results]
                whole = [t.clone().requires_grad_(backward) for t in tensors[:3]]
                expected = F.scaled_dot_product_attention(*whole, is_causal=causal)
                wanted = [expected.detach()]
                if backward:
                    expected.backward(tensors[3])
                    wanted += [t.grad for t in whole]
                diff = max((a - b).abs().max().item()
                           for a, b in zip(found, wanted, strict=True))
            if diff is not None:
                worst = max(worst, diff)
                what = (f"ok, max |difference| {diff:.1e}" if diff <= args.tolerance
                        else f"DIFFERS, max |difference| {diff:.1e}")
                kind = "ok" if diff <= args.tolerance else "differs"
            elif len(set(outcomes)) == 1:
                what, kind = outcomes[0], outcomes[0].split(":")[0]
            else:
                what = "; ".join(f"rank {r}: {o}" for r, o in enumerate(outcomes))
                kind = "mixed"
            rows.append({"case": name,
                         "rotate method": in_force + (" (default)" if method is None else ""),
                         "collectives, rank 0": everyone[0][1], "s, rank 0": f"{seconds:.2f}",
                         "outcome": what})
            short[f"{in_force}_{SHORT[name]}"] = kind
            if not layout and all(h is not None for _, _, h in everyone):
                layout = "; ".join(f"rank {r}: {spans(h)}" for r, (_, _, h) in enumerate(everyone))

    if rank == 0:
        print(f"torch {torch.__version__}'s context_parallel over {world_size} rank(s) on "
              f"{device.type} with {backend}: batch {args.batch_size}, {args.heads} heads, "
              f"{args.seq_len} positions, head dim {args.head_dim}; positions each rank held: "
              f"{layout or 'none'}")
        print(f"rotate method before any set_rotate_method: _cp_options.rotate_method = "
              f"{default_method}; difference: from F.scaled_dot_product_attention on the whole "
              f"sequence in one process (output, and dQ, dK, dV with backward), tolerance "
              f"{args.tolerance:g}")
        print(format_table(rows))
        print(summary_line(world_size=world_size, backend=backend,
                           default_rotate=default_method, **short, max_diff=worst,
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
