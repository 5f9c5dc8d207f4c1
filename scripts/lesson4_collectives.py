"""Lesson 4: every collective on real tensors; each rank's tensor before and after, in rank order.

    make lesson4 NPROC=4              # this script, then lesson4_groups.py
    torchrun --nnodes=1 --nproc-per-node=4 --master-addr=127.0.0.1 --master-port=29500 \
        scripts/lesson4_collectives.py

Rank r starts with the numbers 10r+1, 10r+2, ...: the tens digit says where a value came
from. After each call every rank sends its before/after to rank 0 (gather_object), which
prints one table per collective, and checks every result against the model in
ddpcourse.figures.collectives, the one that draws the lesson's figures.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse.cli import ArgumentParser
from ddpcourse.collectives import NOT_DEFINED, describe, format_values, simulate, values
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import pick_device, world_of_one_unless_launched

# torch 2.14 renamed the one-tensor forms; older releases know only the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = (getattr(dist, "reduce_scatter_single", None)
                         or dist.reduce_scatter_tensor)


def state(x):
    """What a rank holds, as plain numbers: a tensor, a list of tensors, or nothing."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return [x.tolist()]
    return [t.tolist() for t in x]


def flat(states):
    return [None if s is None or s == NOT_DEFINED else [v for chunk in s for v in chunk]
            for s in states]


class Show:
    """Gathers every rank's before/after to rank 0, prints them as a table, checks the model."""

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size
        self.checked, self.mismatches = 0, []

    def __call__(self, name, before, after, root=0, op="sum", call=None, note=None):
        both = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object((before, after), both, dst=0)  # a collective: every rank calls it
        if self.rank != 0:
            return
        befores, afters = [b for b, _ in both], [a for _, a in both]
        model_call, says = describe(name, root, op)
        expected = simulate(name, befores, root=root, op=op)
        rows = []
        for r, (b, a, e) in enumerate(zip(befores, afters, expected, strict=True)):
            shown = format_values(a)
            if e == NOT_DEFINED:
                shown += f"  ({NOT_DEFINED}: only rank {root}'s result is)"
            rows.append({"rank": r, "before": format_values(b), "after": shown})
        for r, (got, want) in enumerate(zip(flat(afters), flat(values(expected)), strict=True)):
            if want is None or want == NOT_DEFINED:
                continue
            if got is None or len(got) != len(want) or any(
                    abs(g - w) > 1e-4 * max(1.0, abs(w)) for g, w in zip(got, want, strict=True)):
                self.mismatches.append(f"{name} on rank {r}: got {got}, the model says {want}")
        self.checked += 1
        print(f"\n{name}: {call or model_call}\n  {note or says}")
        print(format_table(rows), flush=True)


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective may wait before the job fails")
    args = parser.parse_args()
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    started = time.perf_counter()

    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])

    # nccl needs the tensors on this process's GPU; gloo works on CPU tensors.
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # device_id binds the group to this GPU, so nccl's barrier knows which one to use.
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout),
                            device_id=device if device.type == "cuda" else None)
    world = dist.get_world_size()
    show = Show(rank, world)
    if rank == 0:
        print(f"world size {world}, backend {dist.get_backend()}, device {device.type}; "
              "rank r starts with 10r+1, 10r+2")
        if world == 1:
            print("with one rank every collective is trivial: broadcast, reduce, all_reduce, "
                  "gather, all_gather, scatter and reduce_scatter just keep or copy the one "
                  "tensor, and barrier returns at once; send/recv needs two ranks and is "
                  "skipped. Run with NPROC=4 to see data move.")

    def numbered(count=2, first=1):
        """This rank's tensor: 10*rank + first, 10*rank + first + 1, ..."""
        return torch.arange(first, first + count, dtype=torch.float32, device=device) + 10 * rank

    # broadcast: the root's tensor overwrites everyone's (the root keeps its own).
    x = numbered()
    before = state(x)
    dist.broadcast(x, src=0)
    show("broadcast", before, state(x), root=0)

    # reduce: the sum lands on dst only; other ranks' tensors are scratch space afterwards.
    x = numbered()
    before = state(x)
    dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)
    show("reduce", before, state(x), root=0)

    # all_reduce: everyone gets the sum (the operation DDP runs on every gradient).
    x = numbered()
    before = state(x)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    show("all_reduce", before, state(x))

    # The average, portably: sum, then divide by the world size. ReduceOp.AVG exists on nccl;
    # gloo accepts it only in recent torch releases, so scripts that must run anywhere divide.
    x = numbered()
    before = state(x)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    x /= world
    show("all_reduce", before, state(x), op="avg",
         call="dist.all_reduce(x, op=dist.ReduceOp.SUM); x /= world_size",
         note="the average, in a way every backend supports")
    try:
        y = numbered()
        dist.all_reduce(y, op=dist.ReduceOp.AVG)  # fails on every rank alike where unsupported
        avg_note = f"works on {backend} in torch {torch.__version__.split('+')[0]}"
        avg_same = torch.allclose(x, y)
    except (RuntimeError, ValueError) as error:
        avg_note = f"is not supported here ({str(error).splitlines()[0][:80]})"
        avg_same = None
    if rank == 0:
        print(f"  dist.ReduceOp.AVG {avg_note}"
              + (f"; same result as sum / W: {avg_same}" if avg_same is not None else ""))

    x = numbered()
    before = state(x)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    show("all_reduce", before, state(x), op="max")

    # gather: dst receives a list with every rank's tensor; the others pass no list.
    x = numbered()
    gather_list = [torch.zeros_like(x) for _ in range(world)] if rank == 0 else None
    dist.gather(x, gather_list, dst=0)
    show("gather", state(x), state(gather_list), root=0)

    # all_gather: everyone receives the list ...
    x = numbered()
    tensor_list = [torch.zeros_like(x) for _ in range(world)]
    dist.all_gather(tensor_list, x)
    show("all_gather", state(x), state(tensor_list))

    # ... or one tensor of world_size pieces, back to back (no list of small tensors).
    x = numbered()
    out = torch.zeros(world * x.numel(), device=device)
    all_gather_single(out, x)
    show("all_gather", state(x), state(out),
         call=f"dist.{all_gather_single.__name__}(out, x)",
         note="the same, into one tensor of world_size * len(x) numbers")

    # scatter: src hands piece i of its list to rank i; the others pass no list.
    pieces = ([torch.tensor([2.0 * i + 1, 2.0 * i + 2], device=device) for i in range(world)]
              if rank == 0 else None)
    out = torch.zeros(2, device=device)
    dist.scatter(out, pieces, src=0)
    show("scatter", state(pieces), state(out), root=0)

    # reduce_scatter: piece i of every rank's list is summed onto rank i.
    pieces = [numbered(1, first=i + 1) for i in range(world)]
    out = torch.zeros(1, device=device)
    try:
        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM)
        note = None
    except RuntimeError:
        # Backends without reduce_scatter: all_reduce everything, keep your own piece.
        whole = torch.cat(pieces)
        dist.all_reduce(whole)
        out.copy_(whole[rank:rank + 1])
        note = f"{backend} has no reduce_scatter here: done as all_reduce + keep piece {rank}"
    show("reduce_scatter", state(pieces), state(out), note=note)

    whole = torch.cat([numbered(1, first=i + 1) for i in range(world)])
    out = torch.zeros(1, device=device)
    reduce_scatter_single(out, whole, op=dist.ReduceOp.SUM)
    show("reduce_scatter", [[v] for v in whole.tolist()], state(out),
         call=f"dist.{reduce_scatter_single.__name__}(out, x, op=dist.ReduceOp.SUM)",
         note="the same from one tensor of world_size pieces (printed here as its pieces)")

    if world >= 2:
        right, left = (rank + 1) % world, (rank - 1) % world
        # send/recv block until the other side takes part. If every rank sent first, all would
        # wait for a receiver; so even ranks send first and odd ranks receive first.
        x, y = numbered(), torch.zeros(2, device=device)
        if rank % 2 == 0:
            dist.send(x, dst=right)
            dist.recv(y, src=left)
        else:
            dist.recv(y, src=left)
            dist.send(x, dst=right)
        show("send_recv", state(x), state(y),
             call="dist.send(x, dst=(rank+1) % W); dist.recv(y, src=(rank-1) % W)",
             note="a ring shift with blocking calls: even ranks send first, odd ranks "
                  "receive first")

        # isend/irecv return at once with a request to wait on: no ordering puzzle. Post
        # both, then wait for both. (nccl may run one rank's two calls one after the other,
        # so that two ranks each wait in a send; there, use the batch form below.)
        if backend != "nccl":
            x, y = numbered(), torch.zeros(2, device=device)
            requests = [dist.isend(x, dst=right), dist.irecv(y, src=left)]
            for request in requests:
                request.wait()
            show("send_recv", state(x), state(y),
                 call="dist.isend(x, dst=(rank+1) % W); dist.irecv(y, src=(rank-1) % W)",
                 note="both posted at once, then request.wait() on each")

        # Posting them as one batch lets nccl run them together.
        x, y = numbered(), torch.zeros(2, device=device)
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, right),
                                           dist.P2POp(dist.irecv, y, left)])
        for request in requests:
            request.wait()
        show("send_recv", state(x), state(y),
             call="dist.batch_isend_irecv([P2POp(dist.isend, x, (rank+1) % W), "
                  "P2POp(dist.irecv, y, (rank-1) % W)])")

    # barrier: rank r works 0.1 * r seconds; nobody leaves before the last one arrives.
    time.sleep(0.1 * rank)
    arrived = time.time()
    dist.barrier()
    left_at = time.time()
    times = [None] * world if rank == 0 else None
    dist.gather_object((arrived, left_at), times, dst=0)
    if rank == 0:
        last = max(a for a, _ in times)
        rows = [{"rank": r, "worked s": f"{0.1 * r:.1f}", "waited in barrier s": f"{t - a:.2f}"}
                for r, (a, t) in enumerate(times)]
        print(f"\nbarrier: {describe('barrier')[0]}\n  {describe('barrier')[1]}")
        print(format_table(rows))
        show.checked += 1
        early = [r for r, (_, t) in enumerate(times) if t < last - 0.05]
        if early:
            show.mismatches.append(f"barrier: ranks {early} left before the last one arrived")

    if rank == 0:
        for problem in show.mismatches:
            print(f"MISMATCH {problem}")
        print(f"\ncheck: {show.checked - len(show.mismatches)} of {show.checked} results "
              "match the model that draws the lesson's figures")
        print(summary_line(world_size=world, backend=dist.get_backend(),
                           collectives=show.checked,
                           matches_model=f"{show.checked - len(show.mismatches)}/{show.checked}",
                           wall_s=round(time.perf_counter() - started, 2)))
    failed = len(show.mismatches)
    dist.destroy_process_group()
    if failed:
        raise SystemExit(f"error: {failed} collective(s) did not do what the model says")


if __name__ == "__main__":
    main()
