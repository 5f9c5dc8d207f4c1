"""Lesson 10 experiment: six pipeline schedules, from GPipe to zero bubble, side by side.

    make lesson10-schedules NPROC=4                     # prints, then runs, this command:
    torchrun --nproc-per-node=4 scripts/experiments/lesson10_schedules.py

Lesson 8's bubble experiment measured GPipe and 1F1B, one stage
per process. torch.distributed.pipelining has more schedules; this runs six of them on the
same model, S = W processes, M micro-batches per step:

  gpipe             ScheduleGPipe            1 stage per rank: every forward, then every backward
  1f1b              Schedule1F1B             1 stage per rank: after a warm-up, one forward, one
                                             backward (needs M >= S)
  looped-bfs        ScheduleLoopedBFS        v = 2 stages per rank (rank r: stages r and r + S),
                                             each stage's micro-batches all at once
  interleaved-1f1b  ScheduleInterleaved1F1B  v = 2 stages per rank, 1F1B over them (Megatron's;
                                             M a multiple of max(1, M // S))
  interleaved-zb    ScheduleInterleavedZeroBubble  v = 2, the backward split in two: I (the
                                             input's gradient, which the stage before waits for)
                                             and W (the weights', which can wait to fill the gaps)
  zbv               ScheduleZBVZeroBubble    exactly 2 stages per rank in a V: rank r holds stages
                                             r and 2S - 1 - r, so rank 0 has the first and the last

The model is 2S equal blocks, Linear(width, width) and ReLU, so every schedule trains the same
model: two blocks per stage with one stage per rank, one with two. Each block pauses for a fixed
time (--pause-ms) in its forward, in its input-gradient pass and in its weight-gradient pass:
the time of a stage then does not depend on how many of the job's processes share a core, and
F, I and W cost the same, as the zero-bubble paper assumes. For each schedule:
(a) after --steps SGD steps every parameter, gathered from the stages, equals the same model
    trained in one process on the whole batch (largest |difference| printed);
(b) the bubble, 1 - (busy time of all ranks) / (S x step time), measured as lesson 8 does
    (every forward and backward call of every stage timed), beside its formula and beside a
    simulation of the order each rank really ran with those costs and free messages;
(c) the most micro-batches whose activations a rank held at once (forward done, last backward
    pass not yet), counted from the stages' live caches, beside the prediction from the
    schedule's warm-up arithmetic (torch's schedules.py).
Any W runs (1 and 3 as well); what torch would refuse with a traceback (1F1B with M < S,
interleaved with M not a multiple of its rounds) is refused first, in one line. torch 2.14.1
also has ScheduleDualPipeV (V-shaped, forwards and backwards overlapped), not run here.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import (
    end_with_rank_0s_verdict,
    fail,
    pick_device,
    world_of_one_unless_launched,
)

SCHEDULES = {  # name: (torch's class, stages per rank v, how the stages are dealt to the ranks)
    "gpipe": (ScheduleGPipe, 1, "loop"),
    "1f1b": (Schedule1F1B, 1, "loop"),
    "looped-bfs": (ScheduleLoopedBFS, 2, "loop"),
    "interleaved-1f1b": (ScheduleInterleaved1F1B, 2, "loop"),
    "interleaved-zb": (ScheduleInterleavedZeroBubble, 2, "loop"),
    "zbv": (ScheduleZBVZeroBubble, 2, "v"),
}
# Where each bubble formula comes from. With F = I = W (B = I + W), as the pauses make them:
FORMULAS = {
    "(S-1)/(M+S-1)": "GPipe (Huang et al. 2019) and 1F1B: S - 1 stage-steps of filling and "
                     "draining; Narayanan et al. 2021 (Megatron-LM, sec. 2.2.1) write it as "
                     "(p-1)/m of the ideal time",
    "(S-1)/(vM+S-1)": "interleaved 1F1B, Narayanan et al. 2021 sec. 2.2.2: (1/v)(p-1)/m of the "
                      "ideal time, each stage 1/v as long; looped BFS (Lamy-Poirier 2022) fills "
                      "and drains the same way",
    "(S-1)/(3vM+S-1)": "zero bubble, Qi et al. 2024 (arXiv 2401.10241): ZB-H1 (torch's ZB1P) "
                       "leaves a third of 1F1B's (p-1)/m, and v stages divide it by v; ZB-V's "
                       "'zero' needs consecutive steps to overlap (its optimizer post-"
                       "validation): one step from a barrier keeps the S - 1 passes of start-up "
                       "(for M >= 2S - 1)",
}


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", default=",".join(SCHEDULES),
                        help=f"which, separated by commas: {', '.join(SCHEDULES)}")
    parser.add_argument("--micro-batches", type=int, default=None,
                        help="M, micro-batches per step (default 2S)")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="samples in each")
    parser.add_argument("--width", type=int, default=32, help="features of every block")
    parser.add_argument("--pause-ms", type=float, default=8.0,
                        help="fixed time each block spends in each pass (forward, input "
                             "gradient, weight gradient); 0: only the matmuls' own time")
    parser.add_argument("--steps", type=int, default=3,
                        help="SGD steps of each schedule; the first is a warm-up, not timed")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest |difference| from the one-process model that counts as equal")
    parser.add_argument("--show-order", action="store_true",
                        help="print the order in which each rank ran its actions, per schedule")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    args.schedules = args.schedules.split(",")
    if any(s not in SCHEDULES for s in args.schedules):
        parser.error(f"--schedules: choose from {', '.join(SCHEDULES)}")
    if min(args.micro_batch_size, args.width) < 1 or args.steps < 2 or args.pause_ms < 0:
        parser.error("--micro-batch-size and --width must be at least 1, --steps 2, "
                     "--pause-ms 0")
    if args.micro_batches is not None and args.micro_batches < 1:
        parser.error("--micro-batches must be at least 1")
    return args


class Pause(torch.autograd.Function):
    """The identity, which waits `forward_s` seconds going forward, `backward_s` coming back."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        ctx.backward_s = backward_s
        if forward_s:
            time.sleep(forward_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.backward_s:
            time.sleep(ctx.backward_s)
        return grad, None, None


class Block(nn.Module):
    """Linear + ReLU (the model's last block: no ReLU, its outputs are the logits), with a
    fixed pause in each pass: forward; input gradient (the pause on the output: it lies on the
    way back to the input); weight gradient (the pause on the weight: only that pass crosses
    it, which pipelining's zero-bubble schedules run apart, as W)."""

    def __init__(self, width: int, last: bool, pause_s: float):
        super().__init__()
        self.linear, self.last, self.pause_s = nn.Linear(width, width), last, pause_s

    def forward(self, x):
        weight = Pause.apply(self.linear.weight, 0.0, self.pause_s)
        out = Pause.apply(F.linear(x, weight, self.linear.bias), self.pause_s, self.pause_s)
        return out if self.last else torch.relu(out)


def stages_of(rank: int, ranks: int, per_rank: int, style: str) -> list[int]:
    """The stage indices a rank holds, in order: looped (r, r + S, ...) or V (r, 2S - 1 - r)."""
    if style == "v":
        return [rank, 2 * ranks - 1 - rank]
    return [rank + k * ranks for k in range(per_rank)]


def refusal(name: str, ranks: int, micro: int) -> str | None:
    """Why torch's schedule `name` cannot run S = `ranks` ranks with M = `micro`, in one line
    (torch would raise it as a ValueError inside the job), or None."""
    if name == "1f1b" and micro < ranks:
        return (f"Schedule1F1B needs at least as many micro-batches as stages: M = {micro} < "
                f"S = {ranks}; raise --micro-batches or leave 1f1b out of --schedules")
    rounds = max(1, micro // ranks)
    if name.startswith("interleaved") and micro % rounds:
        return (f"{SCHEDULES[name][0].__name__} runs M in rounds of max(1, M // S) = {rounds}: "
                f"M = {micro} is not a multiple of it; use e.g. --micro-batches "
                f"{micro - micro % rounds}")
    return None


def bubble_formula(name: str, ranks: int, micro: int, per_rank: int) -> tuple[str, float]:
    """(the formula's text, its value): the idle share of one step, fill and drain."""
    s, m, v = ranks, micro, per_rank
    if v == 1:
        return "(S-1)/(M+S-1)", (s - 1) / (m + s - 1)
    if name in ("looped-bfs", "interleaved-1f1b"):
        return "(S-1)/(vM+S-1)", (s - 1) / (v * m + s - 1)
    return "(S-1)/(3vM+S-1)", (s - 1) / (3 * v * m + s - 1)


def held_predicted(name: str, ranks: int, micro: int, per_rank: int, rank: int) -> int:
    """The most micro-batches (per stage, all of the rank's stages added) whose activations
    rank `rank` holds at once, from the warm-up each schedule in torch's schedules.py runs
    before its first backward."""
    s, m, v, r = ranks, micro, per_rank, rank
    if name == "gpipe":
        return m                                  # every forward before any backward
    if name == "1f1b":
        return min(m, s - r)                      # warm-up of S - r forwards, then 1 in, 1 out
    if name == "looped-bfs":
        return v * m                              # every stage's forwards before any backward
    if name == "zbv":
        # warm-up 2(S-r)-1 forwards of the first chunk, r pairs, then F I W of the second: 2S;
        # fewer than 2S - 1 micro-batches leave holes in it
        return min(2 * s, 2 * m, m + 1 + r)
    per_round = m // max(1, m // s)
    factor = 2 if name == "interleaved-1f1b" else 1      # torch's _get_warmup_ops
    warmup = min(v * m, (v - 1) * per_round + factor * (s - 1 - r))
    steady = v * m - warmup  # each steady op: one forward (first), one backward
    # 1F1B frees one at the backward of the first steady op; zero bubble frees at W, which
    # rank r starts r steady ops late (torch: num_1f1b_microbatches = rank)
    return warmup + min(1 if name == "interleaved-1f1b" else r + 1, steady)


def simulate(orders: list[list[tuple]], n_stages: int, blocks_per_stage: int) -> float:
    """The bubble of running each rank's actions in the order it ran them, each as soon as
    its inputs exist, messages free: F = I = W = one pause per block (B = I + W). As in torch,
    stage 0's I computes nothing (no input needs a gradient) and its W does the whole backward.
    The order is the one recorded, not torch's `schedule.pipeline_order`: in torch 2.14.1
    Schedule1F1B's lists the last rank's forwards as 1 to M, without micro-batch 0."""
    def cost(kind, stage):
        per = {"F": 1, "B": 2, "I": 0 if stage == 0 else 1, "W": 2 if stage == 0 else 1}
        return per[kind] * blocks_per_stage

    queues = [list(order) for order in orders]
    done, clock, work = {}, [0.0] * len(orders), 0.0
    while any(queues):
        moved = False
        for rank, queue in enumerate(queues):
            while queue:
                kind, stage, micro = queue[0]
                if kind == "F":
                    needs = [[(stage - 1, "F", micro)]] if stage > 0 else []
                elif kind in "BI":  # the gradient from the stage after, or the loss
                    needs = [[(stage, "F", micro)]] + ([[(stage + 1, k, micro) for k in "BI"]]
                                                       if stage < n_stages - 1 else [])
                else:
                    needs = [[(stage, "I", micro)]]
                ready = [next((done[key] for key in keys if key in done), None) for keys in needs]
                if None in ready:
                    break
                start = max([clock[rank], *ready])
                clock[rank] = done[(stage, kind, micro)] = start + cost(kind, stage)
                work += cost(kind, stage)
                queue.pop(0)
                moved = True
        if not moved:
            raise RuntimeError("the recorded orders wait on each other")
    return 1 - work / (len(orders) * max(clock))


def recorded(stage, events: list, live, sync):
    """Wrap a stage's forward_one_chunk, backward_one_chunk and backward_weight_one_chunk
    (what the schedules call for F, B or I, and W) to time each call into `events` as
    (kind, stage, micro-batch, start, end, activations held after it); `sync` waits for the
    device (a GPU runs the work after the call returns)."""
    def wrap(method, kind_of):
        def run(chunk, *args, **kwargs):
            sync()
            start = time.perf_counter()
            result = method(chunk, *args, **kwargs)
            sync()
            events.append((kind_of(kwargs), stage.stage_index, chunk, start,
                           time.perf_counter(), live()))
            return result
        return run

    stage.forward_one_chunk = wrap(stage.forward_one_chunk, lambda kw: "F")
    stage.backward_one_chunk = wrap(stage.backward_one_chunk,
                                    lambda kw: "B" if kw.get("full_backward", True) else "I")
    stage.backward_weight_one_chunk = wrap(stage.backward_weight_one_chunk, lambda kw: "W")


def run_schedule(name, args, ranks, rank, device, batches):
    """Train `args.steps` steps under schedule `name`; this rank's timings, counts, weights."""
    schedule_class, per_rank, style = SCHEDULES[name]
    n_stages = ranks * per_rank
    blocks_per_stage = 2 // per_rank
    torch.manual_seed(args.seed)  # the same initial weights in every run, and in one process
    blocks = [Block(args.width, i == 2 * ranks - 1, args.pause_ms / 1e3)
              for i in range(2 * ranks)]
    mine = stages_of(rank, ranks, per_rank, style)
    modules = {i: nn.Sequential(*blocks[i * blocks_per_stage:(i + 1) * blocks_per_stage]).to(device)
               for i in mine}
    stages = [PipelineStage(modules[i], i, n_stages, device) for i in mine]
    events: list = []

    def live():  # micro-batches whose activations this rank's stages keep (F done, B or W not)
        return sum(len(st.fwd_cache) + len(st.backward_state) for st in stages)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for stage in stages:  # wrapping pipelining's stages: the only way to time each call
        recorded(stage, events, live, sync)
    schedule = schedule_class(stages[0] if per_rank == 1 else stages,
                              n_microbatches=args.micro_batches, loss_fn=F.cross_entropy)
    optimizer = torch.optim.SGD([p for m in modules.values() for p in m.parameters()],
                                lr=args.lr)
    first, last = 0 in mine, n_stages - 1 in mine  # zbv: rank 0 holds both
    steps = []
    for images, labels in batches:
        events.clear()
        optimizer.zero_grad(set_to_none=True)
        dist.barrier()  # the ranks start the step together: one clock for all
        t0 = time.perf_counter()
        schedule.step(*[images] if first else [], target=labels if last else None)
        span = time.perf_counter() - t0
        optimizer.step()  # each rank steps its own stages' parameters
        steps.append({"span": span, "events": [(k, s, c, a - t0, b - t0, h)
                                               for k, s, c, a, b, h in events]})
    weights = {i: [p.detach().cpu().clone() for p in modules[i].parameters()] for i in mine}
    return {"steps": steps, "weights": weights}


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    ranks = int(os.environ["WORLD_SIZE"])  # S: pipeline parallelism only, every rank a stage
    args.micro_batches = args.micro_batches or 2 * ranks
    for name in args.schedules:  # what torch would refuse with a traceback, in one line
        if why := refusal(name, ranks, args.micro_batches):
            fail(why)
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    # No data parallelism: every rank makes the same batches (the first stage uses the inputs,
    # the last the labels); a label is one of `width` classes.
    generator = torch.Generator().manual_seed(args.seed + 1)
    batch = args.micro_batches * args.micro_batch_size
    batches = [(torch.randn(batch, args.width, generator=generator).to(device),
                torch.randint(0, args.width, (batch,), generator=generator).to(device))
               for _ in range(args.steps)]
    if rank == 0:
        print(f"S = {ranks} process(es) on {device.type} with {backend}; {2 * ranks} blocks of "
              f"Linear({args.width}, {args.width}), each pausing {args.pause_ms:g} ms per pass "
              f"(forward, input gradient, weight gradient); batch {batch} in M = "
              f"{args.micro_batches} micro-batches; {args.steps} SGD steps, the first untimed")

    runs = {}
    for name in args.schedules:
        mine = run_schedule(name, args, ranks, rank, device, batches)
        every = [None] * ranks if rank == 0 else None
        dist.gather_object(mine, every, dst=0)
        runs[name] = every

    failed = False
    if rank == 0:
        # The same model, from the same start, on the same batches, in one process, no pauses.
        torch.manual_seed(args.seed)
        whole = nn.Sequential(*[Block(args.width, i == 2 * ranks - 1, 0.0)
                                for i in range(2 * ranks)]).to(device)
        optimizer = torch.optim.SGD(whole.parameters(), lr=args.lr)
        for images, labels in batches:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(whole(images), labels).backward()
            optimizer.step()
        reference = [[p.detach().cpu() for p in block.parameters()] for block in whole]

        rows, facts, worst, held_ok = [], {}, 0.0, True
        for name, every in runs.items():
            _, per_rank, _ = SCHEDULES[name]
            n_stages, blocks_per_stage = ranks * per_rank, 2 // per_rank
            diff = max((a - b).abs().max().item()
                       for st in every for i, params in st["weights"].items()
                       for a, b in zip(params, [p for k in range(blocks_per_stage)
                                                for p in reference[i * blocks_per_stage + k]],
                                       strict=True))
            worst = max(worst, diff)
            bubbles = []
            for step in range(1, args.steps):  # step 0 is the warm-up
                span = max(st["steps"][step]["span"] for st in every)
                busy = sum(e[4] - e[3] for st in every for e in st["steps"][step]["events"])
                bubbles.append(1 - busy / (ranks * span))
            bubble = sorted(bubbles)[len(bubbles) // 2]  # the median step
            last = [st["steps"][-1]["events"] for st in every]
            orders = [[e[:3] for e in sorted(ev, key=lambda e: e[3])] for ev in last]
            held = [max(h for *_, h in ev) for ev in last]
            predicted = [held_predicted(name, ranks, args.micro_batches, per_rank, r)
                         for r in range(ranks)]
            held_ok = held_ok and held == predicted
            formula, expected = bubble_formula(name, ranks, args.micro_batches, per_rank)
            rows.append({"schedule": name, "S": ranks, "v": per_rank, "M": args.micro_batches,
                         "max |diff|": f"{diff:.1e}",
                         "step ms": f"{1e3 * max(st['steps'][-1]['span'] for st in every):.0f}",
                         "bubble": f"{bubble:.3f}", "formula": formula,
                         "predicted": f"{expected:.3f}",
                         "simulated": f"{simulate(orders, n_stages, blocks_per_stage):.3f}",
                         "held per rank": ",".join(map(str, held)),
                         "predicted held": ",".join(map(str, predicted)),
                         "most held / v": f"{max(held) / per_rank:g}"})
            facts[f"bubble_{name.replace('-', '_')}"] = round(bubble, 3)
            if args.show_order:
                print(f"{name}: the order each rank ran (stage, F/B/I/W, micro-batch), last step")
                for r, order in enumerate(orders):
                    print(f"  rank {r}: " + " ".join(f"{s}{k}{c}" for k, s, c in order))
        print(format_table(rows))
        print("max |diff|: the largest difference of any parameter from the same model trained "
              "in one process on the whole batch; bubble: 1 - (busy time of all ranks) / (S x "
              "step time), the median of the timed steps; simulated: the order each rank ran, "
              "F = I = W, messages free (the formulas assume M >= S, for interleaved-1f1b a "
              "multiple of S, for zbv M >= 2S - 1; the simulation holds for any M)")
        for formula, source in FORMULAS.items():
            if any(row["formula"] == formula for row in rows):
                print(f"{formula}: {source}")
        print("held: the most micro-batches whose activations a rank kept at once, counted per "
              "stage (with v = 2 a stage is half a rank's blocks: most held / v compares memory)")
        same = worst <= args.tolerance
        print(f"check: every schedule {'matches' if same else 'DOES NOT match'} the model in one "
              f"process (largest |difference| {worst:.1e}, tolerance {args.tolerance:g}); the "
              f"activations held {'are' if held_ok else 'are NOT'} as predicted on every rank")
        print(summary_line(world_size=ranks, stages=ranks, micro_batches=args.micro_batches,
                           schedules=len(runs), same_as_one_process=same, max_diff=f"{worst:.1e}",
                           held_as_predicted=held_ok, **facts, backend=backend,
                           wall_s=round(time.perf_counter() - started, 2)))
        failed = not (same and held_ok)
    end_with_rank_0s_verdict(failed, device)


if __name__ == "__main__":
    main()
