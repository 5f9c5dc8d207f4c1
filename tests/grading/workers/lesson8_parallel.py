"""Run under torchrun by the lesson 8 grading tests: Zero1Optimizer and pipeline_step in a
real job, with every collective and message the graded code starts recorded (traffic.py).

Zero1Optimizer: a DDP model trains a few steps with Zero1Optimizer, once wrapping SGD with
momentum and once Adam, beside the same model trained by the plain optimizer on the whole
batch in this process. The optimizer class handed to Zero1Optimizer is a subclass that
notes every instance made of it, so the grader knows every optimizer the code created.
  zero1          the parameters equal the plain optimizer's after every run, on every rank;
  zero1_state    every parameter has exactly one owner, the same on every rank; the code made
                 one optimizer, over exactly this rank's parameters, and its state covers
                 exactly them (summed over the ranks: the full state, once);
  zero1_balance  the fullest rank holds no more elements than the largest-first rule gives;
  zero1_gather   step() communicates only by broadcast or all_gather: the parameters'
                 worth of elements per step (less than twice that), no message, no all_reduce.

pipeline_step: a small model is cut into two stages; group ranks 0 and 1 of a two-rank
group run them (the world at W = 2; the group of global ranks 1 and 2 at W = 3, where rank
0 looks on), with 3 and then 4 micro-batches, onto gradients already there.
  pipeline           each stage's gradients (plus what was there) equal the unsplit model's
                     on the whole batch, and stage 1 returns the whole batch's loss;
  pipeline_messages  each stage sent M messages and received M, each one micro-batch's
                     activation, all with the other stage; no collective;
  pipeline_schedule  all forwards, then all backwards: the M activations cross before the
                     first gradient does.

Each check runs in a process group of its own (common.py). Rank 0 prints one line per
verdict: `<name>: ok on W ranks ...` or `<name>: FAILED: ...`. --submissions A,B,...
grades several submission folders, one block after `### submission A` each.
"""

import importlib
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from common import (
    RANK,
    WORLD,
    grade_each_submission,
    run_checks,
)
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from traffic import Traffic

import ddpcourse.runtime  # noqa: F401  before init_process_group: see the comment there

TOLERANCE = 1e-5
GROUP_TIMEOUT = timedelta(seconds=20)
torch.set_num_threads(1)


# --- l8_zero1_optimizer --------------------------------------------------------------------

ZERO_STEPS, ZERO_BATCH = 3, 12   # 12 samples: an equal share at W = 2 and W = 3
OPTIMIZERS = [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, 1),   # (class, defaults,
              (torch.optim.Adam, {"lr": 0.01}, 2)]                    #  state buffers)


def zero_model():
    """Parameters of many sizes (24 to 576 elements), so the split by size matters."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(),
                         nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 4))


def largest_first(sizes, world):
    """The fullest rank's elements under the rule in Zero1Optimizer's docstring."""
    held = [0] * world
    for size in sorted(sizes, reverse=True):
        held[held.index(min(held))] += size
    return max(held)


def recording(optimizer_class):
    """A subclass of optimizer_class that notes each instance made of it."""
    made = []

    class Recorded(optimizer_class):
        def __init__(self, params, *args, **kwargs):
            super().__init__(params, *args, **kwargs)
            made.append(self)

    Recorded.__name__ = optimizer_class.__name__
    return Recorded, made


def gathered(values: list[float]) -> list[list[float]]:
    mine = torch.tensor(values, dtype=torch.float64)
    everyone = [torch.empty_like(mine) for _ in range(WORLD)]
    dist.all_gather(everyone, mine)
    return [t.tolist() for t in everyone]


@contextmanager
def ready_made_zero_refused(ex):
    """ZeRO-1 by hand: torch's ZeroRedundancyOptimizer, and the course's own copy of its
    partition (ddpcourse.sharding.zero_owners, behind the lesson's tables), raise while the
    graded code runs, under whatever name the code holds them."""
    def refuse(what):
        def refused(*args, **kwargs):
            raise AssertionError(f"{what} is a ready-made answer: build ZeRO-1 yourself")
        return refused

    saved = [(ZeroRedundancyOptimizer, "__init__", ZeroRedundancyOptimizer.__init__)]
    try:
        sharding = importlib.import_module("ddpcourse.sharding")
        answer = getattr(sharding, "zero_owners", None)
    except ImportError:
        sharding, answer = None, None
    if answer is not None:
        saved.append((sharding, "zero_owners", answer))
        saved += [(ex, name, value) for name, value in vars(ex).items() if value is answer]
    for owner, name, value in saved:
        what = "ZeroRedundancyOptimizer" if value is saved[0][2] else \
            "ddpcourse.sharding.zero_owners"
        setattr(owner, name, refuse(what))
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def check_zero1(ex):
    with ready_made_zero_refused(ex):
        return zero1_verdicts(ex)


def zero1_verdicts(ex):
    result, state, balance, gather = [], [], [], []
    notes = {}
    for optimizer_class, defaults, buffers in OPTIMIZERS:
        name = optimizer_class.__name__
        model, reference = zero_model(), zero_model()
        wrapped = DDP(model)
        Recorded, made = recording(optimizer_class)
        zero = ex.Zero1Optimizer(model.parameters(), Recorded, **defaults)
        plain = optimizer_class(reference.parameters(), **defaults)
        sizes = [p.numel() for p in model.parameters()]
        total, seen = sum(sizes), Traffic()
        share = slice(RANK * ZERO_BATCH // WORLD, (RANK + 1) * ZERO_BATCH // WORLD)
        for step in range(ZERO_STEPS):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(ZERO_BATCH, 24, generator=g), torch.randint(0, 4, (ZERO_BATCH,),
                                                                          generator=g)
            F.cross_entropy(wrapped(x[share]), y[share]).backward()  # DDP averages the grads
            with seen:
                zero.step()
            zero.zero_grad()
            F.cross_entropy(reference(x), y).backward()
            plain.step()
            plain.zero_grad()
        # zero1: the same parameters as the plain optimizer, on every rank
        mine = torch.cat([p.detach().flatten() for p in model.parameters()])
        ref = torch.cat([p.detach().flatten() for p in reference.parameters()])
        diff = (mine - ref).abs().max().item()
        notes[name] = f"{name} off by {diff:.1e}"
        if diff > TOLERANCE:
            result.append(f"rank {RANK}, {name}: after {ZERO_STEPS} steps the parameters "
                          f"differ from the plain optimizer's by {diff:.2e}")
        everyone = gathered(mine.tolist())
        if any(e != everyone[0] for e in everyone):
            result.append(f"{name}: the ranks ended with different parameters")
        # zero1_state: owners, the one optimizer over this rank's shard, its state
        state += shard_problems(zero, made, model, buffers, total, name)
        # zero1_balance
        owners = list(getattr(zero, "owners", []))
        if len(owners) == len(sizes) and all(o in range(WORLD) for o in owners):
            held = [sum(s for s, o in zip(sizes, owners, strict=True) if o == r)
                    for r in range(WORLD)]
            best = largest_first(sizes, WORLD)
            if max(held) > best:
                balance.append(f"{name}: the shards hold {held} elements; giving the largest "
                               f"parameter first to the emptiest rank fills none beyond {best}")
        else:
            balance.append(f"{name}: no owner per parameter to weigh (self.owners)")
        # zero1_gather
        gather += traffic_problems(seen, total, name)
    return {"zero1": (result, "; ".join(notes.values())), "zero1_state": (state, ""),
            "zero1_balance": (balance, ""), "zero1_gather": (gather, "")}


def shard_problems(zero, made, model, buffers, total, name):
    """Every rank makes the same collectives whatever its code did, so none waits."""
    problems = []
    params, owners = list(getattr(zero, "params", [])), list(getattr(zero, "owners", []))
    if [id(p) for p in params] != [id(p) for p in model.parameters()]:
        problems.append(f"rank {RANK}, {name}: self.params is not the list of parameters given")
        params = list(model.parameters())
    if len(owners) != len(params) or not all(o in range(WORLD) for o in owners):
        problems.append(f"rank {RANK}, {name}: self.owners is not one rank in 0..{WORLD - 1} "
                        "per parameter")
        owners = [-1] * len(params)
    everyones_owners = gathered(owners)
    if any(o != everyones_owners[0] for o in everyones_owners):
        problems.append(f"{name}: the ranks disagree on who owns which parameter")
    owned = {id(p) for p, o in zip(params, owners, strict=True) if o == RANK}
    owned_numel = sum(p.numel() for p in params if id(p) in owned)
    inner = getattr(zero, "optimizer", None)
    if len(made) != 1 or made[0] is not inner:
        problems.append(f"rank {RANK}, {name}: {len(made)} optimizers of the class given were "
                        "made; there must be one, self.optimizer, over this rank's shard")
    stepped = [p for o in made for group in o.param_groups for p in group["params"]]
    if {id(p) for p in stepped} != owned or len(stepped) != len(owned):
        problems.append(f"rank {RANK}, {name}: the optimizer holds {len(stepped)} parameters "
                        f"({sum(p.numel() for p in stepped)} elements); this rank owns "
                        f"{len(owned)} ({owned_numel} elements)")
    kept, foreign = 0, 0
    for o in made:
        for p, s in o.state.items():
            kept += sum(v.numel() for v in s.values()
                        if torch.is_tensor(v) and v.shape == p.shape)
            foreign += id(p) not in owned
    if foreign:
        problems.append(f"rank {RANK}, {name}: state kept for {foreign} parameters other "
                        "ranks own")
    everyone = [int(k[0]) for k in gathered([kept])]
    if sum(everyone) != buffers * total:
        problems.append(f"{name}: the ranks keep {everyone} elements of optimizer state, "
                        f"{sum(everyone)} in all; the model's full state is {buffers} x "
                        f"{total} = {buffers * total}, to be kept once")
    return problems


def traffic_problems(seen, total, name):
    wrong = sorted({c.op for c in seen.collectives
                    if "broadcast" not in c.op and "allgather" not in c.op
                    and "all_gather" not in c.op})
    moved = sum(c.numel for c in seen.collectives)
    problems = []
    if wrong:
        problems.append(f"rank {RANK}, {name}: step() called {', '.join(wrong)}; it should "
                        "only broadcast or all_gather the updated parameters")
    if seen.messages:
        problems.append(f"rank {RANK}, {name}: step() sent or received {len(seen.messages)} "
                        "messages; use broadcast or all_gather")
    low, high = ZERO_STEPS * total, 2 * ZERO_STEPS * total
    if not wrong and not low <= moved < high:
        problems.append(f"rank {RANK}, {name}: step() moved {moved / ZERO_STEPS:g} elements "
                        f"per step by broadcast / all_gather; sharing the {total} parameters "
                        f"takes {total} (less than twice that with padding)")
    return problems


# --- l8_pipeline_step ----------------------------------------------------------------------

PIPELINE_RUNS = [(3, 12), (4, 8)]   # (micro-batches, batch)
HIDDEN = 16


def stages():
    torch.manual_seed(1)
    first = nn.Sequential(nn.Linear(10, HIDDEN), nn.Tanh())
    second = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 5))
    return first, second


def check_pipeline(ex):
    members = [0, 1] if WORLD == 2 else [1, 2]
    group = None if WORLD == 2 else dist.new_group(members)
    verdicts = {"pipeline": [], "pipeline_messages": [], "pipeline_schedule": []}
    where = "the world" if group is None else "the group of ranks 1 and 2"
    if RANK not in members:
        return {name: (problems, where) for name, problems in verdicts.items()}
    me = members.index(RANK)
    for micro, batch in PIPELINE_RUNS:
        g = torch.Generator().manual_seed(micro)
        x, y = torch.randn(batch, 10, generator=g), torch.randint(0, 5, (batch,), generator=g)
        already = 0.5  # gradients already there: a pipeline step adds to them
        # the unsplit model on the whole batch
        first, second = stages()
        loss = F.cross_entropy(second(first(x)), y)
        loss.backward()
        expected = [already + p.grad for p in (first, second)[me].parameters()]
        # the pipeline
        stage = stages()[me]
        for p in stage.parameters():
            p.grad = torch.full_like(p, already)
        shape = (batch // micro, HIDDEN)
        with Traffic() as seen:
            returned = ex.pipeline_step(stage, (x, y)[me], micro, shape, group=group)
        run = f"stage {me} (rank {RANK}), {micro} micro-batches of {batch // micro}"
        verdicts["pipeline"] += result_problems(stage, expected, returned, loss, me, run)
        counted = message_problems(seen, micro, shape, me, run)
        verdicts["pipeline_messages"] += counted
        verdicts["pipeline_schedule"] += schedule_problems(seen, micro, me, run, counted)
    return {name: (problems, where) for name, problems in verdicts.items()}


def result_problems(stage, expected, returned, loss, me, run):
    problems = []
    for (name, p), want in zip(stage.named_parameters(), expected, strict=True):
        if p.grad is None:
            problems.append(f"{run}: {name} has no gradient")
        elif not torch.allclose(p.grad, want, rtol=1e-4, atol=1e-6):
            off = (p.grad - want).abs().max().item()
            problems.append(f"{run}: the gradient of {name} differs from the unsplit model's "
                            f"(plus the {0.5} already there) by {off:.2e}")
    if me == 0 and returned is not None:
        problems.append(f"{run}: returned {type(returned).__name__}, not None")
    if me == 1:
        if not torch.is_tensor(returned) or returned.dim() != 0:
            problems.append(f"{run}: returned {returned!r:.60}, not the loss as a 0-d tensor")
        elif returned.grad_fn is not None or returned.requires_grad:
            problems.append(f"{run}: the loss returned still carries its graph")
        elif abs(returned.item() - loss.item()) > 1e-5:
            problems.append(f"{run}: returned loss {returned.item():.6f}; the whole batch's "
                            f"is {loss.item():.6f}")
    return problems


def message_problems(seen, micro, shape, me, run):
    problems = []
    if seen.collectives:
        ops = sorted({c.op for c in seen.collectives})
        problems.append(f"{run}: called {', '.join(ops)}; a pipeline only sends and receives")
    size = torch.Size(shape).numel()
    sent, received = seen.sent(), seen.received()
    if len(sent) != micro or len(received) != micro:
        problems.append(f"{run}: sent {len(sent)} and received {len(received)} messages; one "
                        f"per micro-batch each way is {micro} and {micro}")
    sizes = sorted({m.numel for m in sent + received})
    if sizes and sizes != [size]:
        problems.append(f"{run}: messages of {sizes} elements; one micro-batch's activation "
                        f"(and its gradient) is {size}")
    peers = {m.peer for m in sent} | {m.peer for m in received if m.peer is not None}
    if peers - {1 - me}:
        problems.append(f"{run}: messages with group ranks {sorted(peers)}; the other stage "
                        f"is group rank {1 - me}")
    return problems


def schedule_problems(seen, micro, me, run, counted):
    if counted:
        return [f"{run}: the messages are not one per micro-batch each way (see "
                "pipeline_messages), so the schedule cannot be read from them"]
    forward = "send" if me == 0 else "recv"
    kinds = [m.kind for m in seen.messages]
    if kinds[:micro] != [forward] * micro:
        order = " ".join("A" if k == forward else "G" for k in kinds)
        return [f"{run}: activations (A) and gradients (G) crossed in the order {order}; "
                f"GPipe runs all {micro} forwards before the first backward"]
    return []


# --- the job -------------------------------------------------------------------------------

CHECKS = {"zero1": check_zero1, "pipeline": check_pipeline}
VERDICTS = {"zero1": ["zero1", "zero1_state", "zero1_balance", "zero1_gather"],
            "pipeline": ["pipeline", "pipeline_messages", "pipeline_schedule"]}


def summary(problems: list[str]) -> str:
    return "; ".join(dict.fromkeys(problems[:6]))  # the same problem on every rank: once


if __name__ == "__main__":
    grade_each_submission(
        lambda store, tag: run_checks(store, tag, 8, CHECKS, VERDICTS, GROUP_TIMEOUT,
                                      summarise=summary),
        "lesson 8 grading checks")
