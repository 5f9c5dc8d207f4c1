"""Lesson 10 experiment: ring attention by hand (context parallelism): the sequence cut into W
blocks, K and V passed around a ring of W ranks, equal to attention in one process.

    make lesson10-ring NPROC=3                          # prints, then runs, this command:
    torchrun --nproc-per-node=3 scripts/experiments/lesson10_ring_attention.py

A long sequence does not fit one device: its activations grow with its length. Context
parallelism cuts the sequence into W contiguous blocks, one per rank. Attention needs every
query against every key, so each rank keeps its block of queries Q and passes its keys and
values (K, V) to rank + 1 while it receives rank - 1's: after W - 1 hops every block of K and
V has visited every rank. A rank never holds the whole score matrix: it merges one block's
partial result at a time with the online-softmax rule (keep the running maximum m and the
running sum l of exp(score - m); when m grows, rescale what came before by exp(m_old - m_new)).
With a causal mask a query block needs only the key blocks up to its own: the later ones are
skipped, but the ring still turns, since the next rank needs them.

Backward rings too (RingAttention below): K and V go round again, and with them the gradient
of each block's K and V, added to by every rank it visits, and one more hop takes it home.
torch.distributed.nn.functional has differentiable collectives but no differentiable
send/recv, so this is a torch.autograd.Function with a hand-written backward.

The results are compared with torch's scaled_dot_product_attention on the whole sequence in
one process; the bytes each rank sends are read from torch's profiler (the backend's send
events) and set beside the prediction: forward, W - 1 hops of a K and a V block; backward,
W - 1 hops of K and V and W hops of their gradients (none at W = 1).
"""

import os
import time
from datetime import timedelta

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # the profiler's own start/stop chatter

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import (
    end_with_rank_0s_verdict,
    fail,
    pick_device,
    world_of_one_unless_launched,
)

FLOAT_BYTES = 4  # float32


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=120,
                        help="positions in the sequence, split in W equal blocks (120 splits "
                             "over 1 to 6 ranks)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest difference from attention in one process that counts as "
                             "equal")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a send or receive may wait for the other processes")
    args = parser.parse_args()
    if min(args.seq_len, args.batch_size, args.heads, args.head_dim) < 1:
        parser.error("--seq-len, --batch-size, --heads and --head-dim must be at least 1")
    return args


def pass_along(tensors):
    """Send `tensors` to the next rank of the ring and receive as many from the previous one.
    Returns (requests to wait for, the buffers that will hold what arrives)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    arriving = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), (rank + 1) % world) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, (rank - 1) % world) for t in arriving]
    return dist.batch_isend_irecv(ops), arriving


def block_scores(q, k, causal, diagonal):
    """Scaled scores of a query block against a key block; on the diagonal block of a causal
    mask, a query may not see the keys after it."""
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if causal and diagonal:
        later = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(later, float("-inf"))
    return scores


class RingAttention(torch.autograd.Function):
    """softmax(Q K^T / sqrt(d)) V for this rank's block of queries, the keys and values of
    every rank's block visiting in turn: at step s this rank holds rank - s's block."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        rank, world = dist.get_rank(), dist.get_world_size()
        running_max = torch.full((*q.shape[:-1], 1), float("-inf"), device=q.device)
        running_sum = torch.zeros(*q.shape[:-1], 1, device=q.device)
        weighted = torch.zeros_like(q)            # sum of exp(score - running_max) x V
        kv = [k, v]
        for step in range(world):
            source = (rank - step) % world        # whose K and V this rank holds now
            if step < world - 1:                  # post the next hop first: it overlaps
                requests, arriving = pass_along(kv)
            if not causal or source <= rank:      # later blocks are masked out: skip them
                scores = block_scores(q, kv[0], causal, source == rank)
                new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
                weights = torch.exp(scores - new_max)
                rescale = torch.exp(running_max - new_max)   # what came before, re-based
                running_sum = running_sum * rescale + weights.sum(-1, keepdim=True)
                weighted = weighted * rescale + weights @ kv[1]
                running_max = new_max
            if step < world - 1:
                for request in requests:
                    request.wait()
                kv = arriving
        out = weighted / running_sum
        log_sum_exp = running_max + running_sum.log()  # enough to rebuild softmax in backward
        ctx.save_for_backward(q, k, v, out, log_sum_exp)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, log_sum_exp = ctx.saved_tensors
        rank, world = dist.get_rank(), dist.get_world_size()
        scale = q.shape[-1] ** -0.5
        delta = (grad_out * out).sum(-1, keepdim=True)   # rowsum(dO * O), as in softmax's rule
        grad_q = torch.zeros_like(q)
        kv = [k, v]
        grad_kv = [torch.zeros_like(k), torch.zeros_like(v)]  # travel with the block they are of
        for step in range(world):
            source = (rank - step) % world
            requests = []
            if step < world - 1:
                requests, arriving = pass_along(kv)
            if not ctx.causal or source <= rank:
                probs = torch.exp(block_scores(q, kv[0], ctx.causal, source == rank)
                                  - log_sum_exp)          # this block's share of the softmax
                grad_probs = grad_out @ kv[1].transpose(-2, -1)
                grad_scores = probs * (grad_probs - delta)
                grad_q += grad_scores @ kv[0] * scale
                grad_kv = [grad_kv[0] + grad_scores.transpose(-2, -1) @ q * scale,
                           grad_kv[1] + probs.transpose(-2, -1) @ grad_out]
            if world > 1:  # the gradients move on with their block; the last hop takes them home
                grad_requests, grad_arriving = pass_along(grad_kv)
                for request in requests + grad_requests:
                    request.wait()
                grad_kv = grad_arriving
                if step < world - 1:
                    kv = arriving
        return grad_q, grad_kv[0], grad_kv[1], None


def predicted_traffic(world: int, block_bytes: int) -> dict[str, tuple[int, int]]:
    """(messages, bytes) one rank sends: a K and a V block per hop, W - 1 hops forward; in
    backward K and V again, and their gradients W hops (the last one home; none at W = 1)."""
    hops, home = world - 1, world if world > 1 else 0
    return {"forward": (2 * hops, 2 * hops * block_bytes),
            "backward": (2 * (hops + home), 2 * (hops + home) * block_bytes)}


def sent(prof, backend: str) -> tuple[int, int]:
    """(messages, bytes) of the sends the profiler saw ("gloo:send", "nccl:send 0->1")."""
    sends = [e for e in prof.events() if e.name.startswith(f"{backend}:send")]
    return len(sends), sum(FLOAT_BYTES * torch.Size(e.input_shapes[0]).numel() for e in sends)


def gather_blocks(block):
    """Every rank's block, joined along the sequence (the dimension before the last)."""
    blocks = [torch.empty_like(block) for _ in range(dist.get_world_size())]
    dist.all_gather(blocks, block.contiguous())
    return torch.cat(blocks, dim=-2)


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if args.seq_len % world_size:
        fail(f"--seq-len {args.seq_len} does not split into {world_size} equal blocks; use a "
             f"multiple of {world_size}")
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    shape = (args.batch_size, args.heads, args.seq_len, args.head_dim)
    generator = torch.Generator().manual_seed(args.seed)
    q_all, k_all, v_all, grad_all = (torch.randn(shape, generator=generator).to(device)
                                     for _ in range(4))
    block = args.seq_len // world_size
    mine = slice(rank * block, (rank + 1) * block)   # this rank's contiguous block of positions
    block_bytes = FLOAT_BYTES * args.batch_size * args.heads * block * args.head_dim
    predicted = predicted_traffic(world_size, block_bytes)

    diffs, traffic, worst = [], [], 0.0
    for causal in (True, False):
        q, k, v = (t[:, :, mine].clone().requires_grad_() for t in (q_all, k_all, v_all))
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as forward:
            out = RingAttention.apply(q, k, v, causal)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as backward:
            out.backward(grad_all[:, :, mine])
        measured = {"forward": sent(forward, backend), "backward": sent(backward, backend)}
        # a block computed is two products, Q K^T and weights V: count them, skips included
        computed = sum(e.name == "aten::matmul" for e in forward.events()) // 2
        traffic.append((causal, rank, computed, measured))
        ring = [gather_blocks(t) for t in (out.detach(), q.grad, k.grad, v.grad)]
        if rank == 0:  # the same attention on the whole sequence, in one process
            whole = [t.clone().requires_grad_() for t in (q_all, k_all, v_all)]
            expected = F.scaled_dot_product_attention(*whole, is_causal=causal)
            expected.backward(grad_all)
            wanted = [expected.detach(), *(t.grad for t in whole)]
            found = [(a - b).abs().max().item() for a, b in zip(ring, wanted, strict=True)]
            worst = max(worst, *found)
            diffs.append({"attention": "causal" if causal else "full",
                          **{f"{name} diff": f"{d:.1e}"
                             for name, d in zip(("out", "dQ", "dK", "dV"), found, strict=True)}})

    every = [None] * world_size if rank == 0 else None
    dist.gather_object(traffic, every, dst=0)
    failed = False
    if rank == 0:
        rows, as_predicted = [], True
        for causal in (True, False):
            for entries in every:
                for is_causal, r, computed, measured in entries:
                    if is_causal != causal:
                        continue
                    row = {"attention": "causal" if causal else "full", "rank": r,
                           "blocks computed": f"{computed} of {world_size}"}
                    for phase in ("forward", "backward"):
                        (n, size), (n_pred, size_pred) = measured[phase], predicted[phase]
                        as_predicted &= (n, size) == (n_pred, size_pred)
                        row[f"{phase} msgs"] = f"{n} ({n_pred})"
                        row[f"{phase} bytes"] = size
                        row[f"{phase} predicted"] = size_pred
                    rows.append(row)
        print(f"ring attention over {world_size} rank(s) on {device.type} with {backend}: "
              f"batch {args.batch_size}, {args.heads} heads, {args.seq_len} positions as "
              f"{world_size} block(s) of {block}, head dim {args.head_dim}; one K or V block "
              f"is {block_bytes:,} bytes")
        print("largest |difference| from scaled_dot_product_attention on the whole sequence:")
        print(format_table(diffs))
        print()
        print(f"sent by each rank ({backend}'s send events in torch's profiler; messages: "
              f"measured (predicted); blocks computed: the profiler's matmuls / 2):")
        print(format_table(rows))
        same = worst <= args.tolerance
        print(f"check: ring attention {'equals' if same else 'DOES NOT equal'} attention in "
              f"one process (largest difference {worst:.1e}, tolerance {args.tolerance:g}); "
              f"traffic {'as' if as_predicted else 'NOT as'} predicted")
        print(summary_line(world_size=world_size, seq_len=args.seq_len, block_bytes=block_bytes,
                           max_diff=worst, same_as_one_process=same,
                           traffic_as_predicted=as_predicted, backend=backend,
                           wall_s=round(time.perf_counter() - started, 2)))
        failed = not (same and as_predicted)
    end_with_rank_0s_verdict(failed, device)


if __name__ == "__main__":
    main()
