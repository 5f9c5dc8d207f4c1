"""Lesson 10 experiment: expert parallelism: a mixture-of-experts layer whose experts live on
different ranks, tokens sent to them and back with all_to_all_single, equal to one process.

    make lesson10-moe NPROC=3                           # prints, then runs, this command:
    torchrun --nproc-per-node=3 scripts/experiments/lesson10_moe.py

A mixture-of-experts (MoE) layer holds E small MLPs, the experts, and a router: a linear layer
that scores every token against every expert. Each token goes to its top-k experts only (k = 1
or 2), and the layer's output is their outputs weighted by the router's softmax. With W ranks,
each rank keeps E / W of the experts (rank r: experts r E/W to (r + 1) E/W - 1) and the router
whole. A rank's tokens must travel to the ranks of their experts, and their results back:
1. sort this rank's (token, expert) pairs by expert, so that each destination's rows are
   contiguous (the permutation);
2. all_to_all_single of the counts: every rank learns how many rows each source will send to
   each of its experts (the split sizes of step 3, which differ from rank to rank);
3. all_to_all_single of the rows, with those uneven split sizes (the dispatch);
4. each expert runs on the rows it received;
5. the inverse all_to_all_single (the combine), and the inverse permutation: each result is
   back in its token's place, where the router's weights add them up.
Backward runs the same trip in reverse: AllToAll below is a torch.autograd.Function whose
backward is the all_to_all_single with the split sizes swapped. No token is dropped: there is
no capacity limit here, so a popular expert's rank simply gets more rows (see the load).

Everything is compared with the same layer computed in one process, all experts local (no
sort, no all-to-all: each expert picks its tokens by mask): the output, the input's gradient,
the router's (summed over the ranks, as DDP would) and every expert's. The bytes each rank
hands to all_to_all_single are read from torch's profiler and set beside the prediction: in
forward, its tokens x k rows out and the rows its experts got back, hidden x 4 bytes each;
the same again in backward.
"""

import copy
import os
import time
from datetime import timedelta

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # the profiler's own start/stop chatter

import torch
import torch.distributed as dist
import torch.nn as nn
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
    parser.add_argument("--tokens", type=int, default=24, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=16, help="features of a token")
    parser.add_argument("--ffn", type=int, default=32, help="hidden features inside an expert")
    parser.add_argument("--experts", type=int, default=None,
                        help="E, a multiple of the number of ranks (default: 2 per rank)")
    parser.add_argument("--top-k", type=int, choices=(1, 2), default=1,
                        help="experts per token")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest difference from the layer in one process that counts as "
                             "equal")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if min(args.tokens, args.hidden, args.ffn) < 1:
        parser.error("--tokens, --hidden and --ffn must be at least 1")
    if args.experts is not None and args.experts < args.top_k:
        parser.error(f"--experts must be at least --top-k ({args.top_k})")
    return args


def make_expert(hidden: int, ffn: int) -> nn.Module:
    return nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))


class AllToAll(torch.autograd.Function):
    """all_to_all_single with split sizes, differentiable: rank r's rows for rank j go to j,
    and in backward the gradients of the rows it received go back where they came from."""

    @staticmethod
    def forward(ctx, rows, receive_splits, send_splits):
        ctx.splits = receive_splits, send_splits
        received = rows.new_empty(sum(receive_splits), *rows.shape[1:])
        dist.all_to_all_single(received, rows.contiguous(), receive_splits, send_splits)
        return received

    @staticmethod
    def backward(ctx, grad_received):
        receive_splits, send_splits = ctx.splits  # the same trip, reversed
        return AllToAll.apply(grad_received, send_splits, receive_splits), None, None


def route(router: nn.Module, x: torch.Tensor, top_k: int):
    """(weights, experts): each token's top-k experts and their softmax probabilities."""
    return router(x).softmax(dim=-1).topk(top_k, dim=-1)


def moe_parallel(x, router, local_experts, n_experts: int, top_k: int):
    """The layer with this rank's experts only: (output, chosen experts, rows per expert
    this rank sent, rows its experts received from each rank [W, E/W])."""
    world = dist.get_world_size()
    per_rank = n_experts // world
    weights, chosen = route(router, x, top_k)
    pairs = chosen.reshape(-1)                      # pair t k + j: token t's j-th expert
    order = torch.argsort(pairs, stable=True)       # by expert, so by the expert's rank
    rows = x[order // top_k]                        # 1. one row per pair, grouped by expert
    per_expert = torch.bincount(pairs, minlength=n_experts)
    # 2. the counts first: from_each[s, e] = rows rank s sends to my local expert e
    from_each = torch.empty_like(per_expert)
    dist.all_to_all_single(from_each, per_expert)   # E/W counts to each rank, all even
    from_each = from_each.view(world, per_rank)
    send_splits = per_expert.view(world, per_rank).sum(1).tolist()
    receive_splits = from_each.sum(1).tolist()
    received = AllToAll.apply(rows, receive_splits, send_splits)   # 3. the dispatch
    # 4. rows arrive by source rank, then by expert; each expert runs once on all of its own
    expert_of_row = torch.arange(per_rank, device=x.device).repeat(world).repeat_interleave(
        from_each.flatten())
    processed = torch.zeros_like(received)
    for e, expert in enumerate(local_experts):
        mine = (expert_of_row == e).nonzero().squeeze(1)
        processed = processed.index_copy(0, mine, expert(received[mine]))
    returned = AllToAll.apply(processed, send_splits, receive_splits)  # 5. the combine
    by_pair = returned[torch.argsort(order)]        # the inverse permutation
    out = (by_pair.view(len(x), top_k, -1) * weights.unsqueeze(-1)).sum(1)
    return out, chosen, per_expert, from_each


def moe_one_process(x, router, experts, top_k: int):
    """The same layer, all experts here: each expert takes the tokens that chose it."""
    weights, chosen = route(router, x, top_k)
    out = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = (chosen == e).nonzero(as_tuple=True)
        out = out.index_add(0, token, expert(x[token]) * weights[token, slot].unsqueeze(1))
    return out, chosen


def all_to_all_traffic(prof, rank: int, world: int) -> dict[str, int]:
    """Bytes this process handed to all_to_all_single, from the profiler's c10d events: rows
    (float32) and counts (int64), and the rows' bytes that went to other ranks."""
    found = {"rows": 0, "to others": 0, "counts": 0, "calls": 0}
    for event in prof.events():
        if event.name != "c10d::alltoall_base_":
            continue
        shape = torch.Size(event.input_shapes[1])   # (output, input, group, out splits, in..)
        send_splits = event.concrete_inputs[4] or [shape[0] // world] * world  # none: even
        found["calls"] += 1
        if len(shape) == 1:                         # the counts: int64
            found["counts"] += 8 * shape.numel()
            continue
        row_bytes = FLOAT_BYTES * shape[1:].numel()
        found["rows"] += row_bytes * shape[0]
        found["to others"] += row_bytes * sum(n for j, n in enumerate(send_splits) if j != rank)
    return found


def gathered(t: torch.Tensor) -> torch.Tensor:
    """Every rank's `t` (equal shapes), joined along the first dimension."""
    pieces = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, t.contiguous())
    return torch.cat(pieces)


def flat_grads(modules) -> torch.Tensor:
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros_like(p).flatten()
                      for m in modules for p in m.parameters()])


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    n_experts = args.experts or 2 * world_size
    if n_experts % world_size:
        fail(f"--experts {n_experts} does not split evenly over {world_size} ranks; use a "
             f"multiple of {world_size}")
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    per_rank = n_experts // world_size
    mine = range(rank * per_rank, (rank + 1) * per_rank)   # this rank's experts

    torch.manual_seed(args.seed)  # the same router and experts on every rank, then each keeps
    router = nn.Linear(args.hidden, n_experts).to(device)  # its own experts only
    experts = nn.ModuleList(make_expert(args.hidden, args.ffn) for _ in range(n_experts))
    experts = experts.to(device)
    local_experts = copy.deepcopy(experts[mine.start:mine.stop])
    local_router = copy.deepcopy(router)
    generator = torch.Generator().manual_seed(args.seed)
    x_all, grad_all = (torch.randn(world_size * args.tokens, args.hidden,
                                   generator=generator).to(device) for _ in range(2))
    tokens = slice(rank * args.tokens, (rank + 1) * args.tokens)  # this rank's tokens

    x = x_all[tokens].clone().requires_grad_()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as forward:
        out, chosen, _, from_each = moe_parallel(x, local_router, local_experts, n_experts,
                                                 args.top_k)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as backward:
        out.backward(grad_all[tokens])
    dist.all_reduce(local_router.weight.grad)  # the router is replicated: add its gradients
    dist.all_reduce(local_router.bias.grad)
    measured = {"forward": all_to_all_traffic(forward, rank, world_size),
                "backward": all_to_all_traffic(backward, rank, world_size)}
    every_out, every_chosen, every_x_grad = (gathered(t) for t in (out.detach(), chosen, x.grad))
    every_expert_grad = gathered(flat_grads(local_experts))  # rank order = expert order
    facts = [None] * world_size if rank == 0 else None
    dist.gather_object((measured, from_each.sum(0).tolist()), facts, dst=0)

    failed = False
    if rank == 0:  # the same layer in one process, on every rank's tokens
        x_whole = x_all.clone().requires_grad_()
        expected, chosen_whole = moe_one_process(x_whole, router, experts, args.top_k)
        expected.backward(grad_all)
        same_routing = torch.equal(every_chosen, chosen_whole)
        load = torch.bincount(chosen_whole.flatten(), minlength=n_experts).tolist()
        sizes = [p.numel() for p in experts[0].parameters()]
        expert_size = sum(sizes)
        expert_rows, worst_expert = [], 0.0
        for e, expert in enumerate(experts):
            ours = every_expert_grad[e * expert_size:(e + 1) * expert_size]
            diff = (ours - flat_grads([expert])).abs().max().item()
            worst_expert = max(worst_expert, diff)
            expert_rows.append({"expert": e, "rank": e // per_rank, "tokens": load[e],
                                "weight grad diff": f"{diff:.1e}"})
        diffs = {"output": (every_out - expected.detach()).abs().max().item(),
                 "input grad": (every_x_grad - x_whole.grad).abs().max().item(),
                 "router grad": max((local_router.weight.grad - router.weight.grad).abs().max(),
                                    (local_router.bias.grad - router.bias.grad).abs().max()
                                    ).item(),
                 "expert weight grads": worst_expert}
        worst = max(diffs.values())

        row_bytes = FLOAT_BYTES * args.hidden
        sent_rows = args.tokens * args.top_k
        rank_rows, as_predicted = [], True
        for r, (traffic, received_per_expert) in enumerate(facts):
            experts_here = range(r * per_rank, (r + 1) * per_rank)
            got = sum(load[e] for e in experts_here)    # rows its experts process
            own = chosen_whole[r * args.tokens:(r + 1) * args.tokens]
            stays = int(((own >= experts_here.start) & (own < experts_here.stop)).sum())
            predicted = (sent_rows + got) * row_bytes    # dispatch out, then combine back
            predicted_others = (sent_rows - stays + got - stays) * row_bytes  # not to itself
            as_predicted &= received_per_expert == load[experts_here.start:experts_here.stop]
            as_predicted &= traffic["forward"]["counts"] == 8 * n_experts  # int64 counts
            as_predicted &= traffic["backward"]["counts"] == 0             # none in backward
            as_predicted &= all(traffic[p]["rows"] == predicted
                                and traffic[p]["to others"] == predicted_others
                                for p in ("forward", "backward"))
            rank_rows.append({
                "rank": r, "experts": f"{experts_here.start}-{experts_here.stop - 1}",
                "rows sent": sent_rows, "rows received": got,
                "forward bytes": traffic["forward"]["rows"],
                "backward bytes": traffic["backward"]["rows"],
                "predicted": predicted,
                "to other ranks": f"{traffic['forward']['to others']} ({predicted_others})",
                "counts bytes": traffic["forward"]["counts"]})
        as_predicted &= same_routing

        mean = sum(load) / n_experts
        print(f"mixture of experts over {world_size} rank(s) on {device.type} with {backend}: "
              f"{n_experts} experts ({per_rank} per rank), top-{args.top_k}, {args.tokens} "
              f"tokens per rank of {args.hidden} features, experts {args.hidden} -> "
              f"{args.ffn} -> {args.hidden}")
        print("tokens routed to each expert, and the largest |difference| of its weights' "
              "gradients from the layer in one process:")
        print(format_table(expert_rows))
        print()
        print("all_to_all_single per rank (bytes handed to it, from torch's profiler; predicted: "
              f"(rows sent + rows received) x {row_bytes} bytes, in each direction):")
        print(format_table(rank_rows))
        print()
        for name, diff in diffs.items():
            print(f"largest |difference| from one process, {name}: {diff:.1e}")
        same = worst <= args.tolerance
        print(f"routing: {'the same' if same_routing else 'NOT the same'} experts chosen for "
              f"every token as in one process; busiest expert {max(load)} tokens, "
              f"{max(load) / mean:.2f} x the mean {mean:.1f}")
        print(f"check: the expert-parallel layer {'equals' if same else 'DOES NOT equal'} the "
              f"layer in one process (largest difference {worst:.1e}, tolerance "
              f"{args.tolerance:g}); bytes {'as' if as_predicted else 'NOT as'} predicted")
        print(summary_line(world_size=world_size, experts=n_experts, top_k=args.top_k,
                           tokens=args.tokens * world_size, max_diff=worst,
                           same_as_one_process=same, bytes_as_predicted=as_predicted,
                           imbalance=round(max(load) / mean, 2), backend=backend,
                           wall_s=round(time.perf_counter() - started, 2)))
        failed = not (same and as_predicted)
    end_with_rank_0s_verdict(failed, device)


if __name__ == "__main__":
    main()
