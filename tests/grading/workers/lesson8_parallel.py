"""Run under torchrun by the lesson 8 grading tests: Zero1Optimizer and pipeline_step in a
real job, with every collective and message the graded code starts recorded (traffic.py).

Zero1Optimizer: a DDP model trains a few steps with Zero1Optimizer, beside the same model
trained by the plain optimizer on the whole batch in this process. The optimizer class
handed to Zero1Optimizer is a subclass that notes every instance made of it, so the grader
knows every optimizer the code created. In the world, once wrapping SGD with momentum and
once Adam:
  zero1          the parameters equal the plain optimizer's after every run, on every rank;
  zero1_state    every parameter has exactly one owner, the same on every rank; the code made
                 one optimizer, over exactly this rank's parameters, and its state covers
                 exactly them (summed over the ranks: the full state, once);
  zero1_balance  the fullest rank holds no more elements than the largest-first rule gives;
  zero1_gather   each step() communicates only by broadcast or all_gather, on the optimizer's
                 group, no barrier, no message: in bytes, exactly the parameters' by
                 broadcast, at most the group's size x the fullest shard by all_gather.
  zero1_group    Adam in a sub-group where group ranks are not global ranks (global rank 1
                 alone at W = 2; global ranks 1 and 2 at W = 3; the others look on): the
                 parameters, each rank's shard by its group rank, and the traffic, as above;
  zero1_idle     more ranks than parameters: the rank that owns none makes no optimizer, and
                 the parameters still end right everywhere.

pipeline_step: a small model is cut into two stages; group ranks 0 and 1 of a two-rank
group run them (the world at W = 2; the group of global ranks 1 and 2 at W = 3, where rank
0 looks on), with 3 and then 4 micro-batches, onto gradients already there.
  pipeline           each stage's gradients (plus what was there) equal the unsplit model's
                     on the whole batch, and stage 1 returns the whole batch's loss;
  pipeline_messages  each stage sent M messages and received M, each one micro-batch's
                     float32 activation (elements and bytes), all with the other stage; no
                     collective;
  pipeline_schedule  all forwards, then all backwards: the M activations cross before the
                     first gradient does.
  pipeline_group_refused  a group of one (every rank), and at W = 3 the world of three: a
                     one-line ValueError before the stage runs or any message is tried;
  pipeline_split_refused  the same for a batch of 10 in 3 micro-batches and for 0.

Each check runs in a process group of its own (common.py). Rank 0 prints one line per
verdict: `<name>: ok on W ranks ...` or `<name>: FAILED: ...`. --submissions A,B,...
grades several submission folders, one block after `### submission A` each.
"""

import gc
import importlib
import weakref
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
    one_line,
    run_checks,
)
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from traffic import Traffic

import ddpcourse.runtime  # noqa: F401  before init_process_group: see the comment there

TOLERANCE = 1e-5
GROUP_TIMEOUT = timedelta(seconds=30)  # as the other lessons: room for a loaded machine
torch.set_num_threads(1)


# --- l8_zero1_optimizer --------------------------------------------------------------------

ZERO_STEPS, ZERO_BATCH = 3, 12   # 12 samples: an equal share at W = 1, 2 and 3
OPTIMIZERS = [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, 1),   # (class, defaults,
              (torch.optim.Adam, {"lr": 0.01}, 2)]                    #  state buffers)
ZERO_GROUP = [1] if WORLD == 2 else [1, 2]   # global ranks: group rank 0 is not global 0


def zero_model():
    """Parameters of many sizes (24 to 576 elements), so the split by size matters."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(),
                         nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 4))


def idle_model():
    """Fewer parameters than ranks (one at W = 2, two at W = 3): the last rank owns none."""
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(24, 4, bias=WORLD > 2))


def largest_first(sizes, world):
    """The fullest rank's share under the rule in Zero1Optimizer's docstring."""
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


class StepTraffic(Traffic):
    """Traffic, and the barriers it leaves out: they move no data, but a barrier in every
    step is a wait that ZeRO-1's broadcasts (which wait for their data) do not need."""

    BARRIERS = ("c10d::barrier", "c10d::monitored_barrier_")

    def __init__(self):
        super().__init__()
        self.barriers = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d" and func._schema.name in self.BARRIERS:
            self.barriers += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


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


def zero1_run(ex, make_model, optimizer_class, defaults, group=None):
    """ZERO_STEPS steps of a DDP model over `group` (None: the world, and Zero1Optimizer is
    not told of a group) with Zero1Optimizer, beside the same model trained by the plain
    optimizer on the whole batch in this process: (zero, the optimizers it made, the model,
    the plain optimizer's model, each step()'s traffic)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    model, reference = make_model(), make_model()
    wrapped = DDP(model, process_group=group)
    Recorded, made = recording(optimizer_class)
    in_group = {} if group is None else {"group": group}
    with ready_made_zero_refused(ex):
        zero = made_on_every_rank(
            lambda: ex.Zero1Optimizer(model.parameters(), Recorded, **in_group, **defaults),
            group)
        plain = optimizer_class(reference.parameters(), **defaults)
        share = slice(rank * ZERO_BATCH // size, (rank + 1) * ZERO_BATCH // size)
        steps = []
        for step in range(ZERO_STEPS):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(ZERO_BATCH, 24, generator=g)
            y = torch.randint(0, 4, (ZERO_BATCH,), generator=g)
            F.cross_entropy(wrapped(x[share]), y[share]).backward()  # DDP averages the grads
            with StepTraffic() as seen:
                zero.step()
            steps.append(seen)
            zero.zero_grad()
            F.cross_entropy(reference(x), y).backward()
            plain.step()
            plain.zero_grad()
    return zero, made, model, reference, steps


def made_on_every_rank(make, group):
    """make() on every rank of `group`, or an error on every one if it raised on any: the
    others would wait in their first step for a rank that is gone."""
    try:
        made, error = make(), None
    except Exception as raised:  # the graded code ran: anything may come out
        made, error = None, raised
    failed = torch.tensor([error is not None], dtype=torch.int64)
    dist.all_reduce(failed, group=group)
    if error is not None:
        raise error
    if failed.item():
        raise RuntimeError(f"Zero1Optimizer(...) raised on {failed.item()} other rank(s)")
    return made


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def parameter_problems(model, reference, who) -> list[str]:
    diff = (flat(model) - flat(reference)).abs().max().item()
    if diff > TOLERANCE:
        return [f"{who}: after {ZERO_STEPS} steps the parameters differ from the plain "
                f"optimizer's by {diff:.2e}"]
    return []


def check_zero1(ex):
    """In the world: SGD with momentum, then Adam."""
    result, state, balance, share = [], [], [], []
    notes = {}
    for optimizer_class, defaults, buffers in OPTIMIZERS:
        name = optimizer_class.__name__
        who = f"rank {RANK}, {name}"
        zero, made, model, reference, steps = zero1_run(ex, zero_model, optimizer_class,
                                                        defaults)
        sizes = [p.numel() for p in model.parameters()]
        # zero1: the same parameters as the plain optimizer, on every rank
        notes[name] = f"{name} off by {(flat(model) - flat(reference)).abs().max():.1e}"
        result += parameter_problems(model, reference, who)
        everyone = gathered(flat(model).tolist())
        if any(e != everyone[0] for e in everyone):
            result.append(f"{name}: the ranks ended with different parameters")
        # zero1_state: owners, the one optimizer over this rank's shard, its state
        problems, owners, kept = shard_problems(zero, made, model, RANK, WORLD, who)
        state += problems + shared_state_problems(owners, kept, buffers * sum(sizes), name)
        # zero1_balance
        if -1 not in owners:
            held = [sum(s for s, o in zip(sizes, owners, strict=True) if o == r)
                    for r in range(WORLD)]
            best = largest_first(sizes, WORLD)
            if max(held) > best:
                balance.append(f"{name}: the shards hold {held} elements; giving the largest "
                               f"parameter first to the emptiest rank fills none beyond {best}")
        else:
            balance.append(f"{name}: no owner per parameter to weigh (self.owners)")
        # zero1_gather
        share += share_problems(steps, model, owners, list(range(WORLD)), who)
    return {"zero1": (result, "; ".join(notes.values())), "zero1_state": (state, ""),
            "zero1_balance": (balance, ""), "zero1_gather": (share, "")}


def check_zero1_group(ex):
    """Adam in the sub-group ZERO_GROUP, which every rank takes part in making; the other
    ranks look on."""
    group = dist.new_group(ZERO_GROUP, timeout=GROUP_TIMEOUT)
    where = f"in the group of global ranks {ZERO_GROUP}"
    if RANK not in ZERO_GROUP:
        return {"zero1_group": ([], where)}
    rank, size = dist.get_rank(group), len(ZERO_GROUP)
    who = f"rank {RANK} (rank {rank} of the group of global ranks {ZERO_GROUP}), Adam"
    zero, made, model, reference, steps = zero1_run(ex, zero_model, torch.optim.Adam,
                                                    {"lr": 0.01}, group)
    problems, owners, _ = shard_problems(zero, made, model, rank, size, who)
    problems = (parameter_problems(model, reference, who) + problems
                + share_problems(steps, model, owners, ZERO_GROUP, who))
    return {"zero1_group": (problems, where)}


def check_zero1_idle(ex):
    """More ranks than parameters: the last rank owns none, makes no optimizer, and still
    takes part in the sharing."""
    who = f"rank {RANK}, {len(list(idle_model().parameters()))} parameters on {WORLD} ranks"
    zero, made, model, reference, _ = zero1_run(ex, idle_model, torch.optim.SGD,
                                                {"lr": 0.1, "momentum": 0.9})
    problems = parameter_problems(model, reference, who)
    problems += shard_problems(zero, made, model, RANK, WORLD, who)[0]
    return {"zero1_idle": (problems, "")}


def shard_problems(zero, made, model, rank, size, who):
    """(problems, owners, elements of state kept) on this rank, which is `rank` of a group
    of `size`: one owner in 0..size-1 per parameter; one optimizer made, self.optimizer,
    over exactly the parameters this rank owns, with state for them only (none made, and
    self.optimizer None, where it owns none). Owners -1 where self.owners is no such list."""
    problems = []
    params, owners = list(getattr(zero, "params", [])), list(getattr(zero, "owners", []))
    if [id(p) for p in params] != [id(p) for p in model.parameters()]:
        problems.append(f"{who}: self.params is not the list of parameters given")
        params = list(model.parameters())
    if len(owners) != len(params) or not all(o in range(size) for o in owners):
        problems.append(f"{who}: self.owners is not one rank in 0..{size - 1} per parameter "
                        "(ranks in the optimizer's group)")
        owners = [-1] * len(params)
    owned = {id(p) for p, o in zip(params, owners, strict=True) if o == rank}
    owned_numel = sum(p.numel() for p in params if id(p) in owned)
    inner = getattr(zero, "optimizer", None)
    if not owned and (made or inner is not None):
        problems.append(f"{who}: this rank owns no parameter, yet {len(made)} optimizers of "
                        "the class given were made; there must be none, self.optimizer None")
    elif owned and (len(made) != 1 or made[0] is not inner):
        problems.append(f"{who}: {len(made)} optimizers of the class given were made; there "
                        "must be one, self.optimizer, over this rank's shard")
    stepped = [p for o in made for group in o.param_groups for p in group["params"]]
    if {id(p) for p in stepped} != owned or len(stepped) != len(owned):
        problems.append(f"{who}: the optimizer holds {len(stepped)} parameters "
                        f"({sum(p.numel() for p in stepped)} elements); this rank owns "
                        f"{len(owned)} ({owned_numel} elements)")
    kept, foreign = 0, 0
    for o in made:
        for p, s in o.state.items():
            kept += sum(v.numel() for v in s.values()
                        if torch.is_tensor(v) and v.shape == p.shape)
            foreign += id(p) not in owned
    if foreign:
        problems.append(f"{who}: state kept for {foreign} parameters other ranks own")
    return problems, [int(o) for o in owners], kept


def shared_state_problems(owners, kept, full, name):
    """In the world: the ranks agree on the owners, and keep the full state once between
    them. Every rank makes the same collectives whatever its code did, so none waits."""
    problems = []
    everyones_owners = gathered(owners)
    if any(o != everyones_owners[0] for o in everyones_owners):
        problems.append(f"{name}: the ranks disagree on who owns which parameter")
    everyone = [int(k[0]) for k in gathered([kept])]
    if sum(everyone) != full:
        problems.append(f"{name}: the ranks keep {everyone} elements of optimizer state, "
                        f"{sum(everyone)} in all; the model's full state is {full}, to be "
                        "kept once")
    return problems


def sharing(op: str) -> bool:
    return "broadcast" in op or gathering(op)


def gathering(op: str) -> bool:
    return "allgather" in op or "all_gather" in op


def share_problems(steps, model, owners, members, who):
    """What each step() moved on this rank, a member of the group of global ranks
    `members`: broadcast or all_gather only, on that group; no barrier, no message; in
    bytes, exactly the parameters' by broadcast, at most the group's size times the
    fullest shard by all_gather (the shards padded to equal length); in a group of one,
    nothing or the parameters' bytes."""
    size = len(members)
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    needed = sum(sizes)
    if -1 in owners:
        fullest = largest_first(sizes, size)
    else:
        fullest = max(sum(b for b, o in zip(sizes, owners, strict=True) if o == r)
                      for r in range(size))
    problems = []
    for seen in steps:
        wrong = sorted({c.op for c in seen.collectives if not sharing(c.op)})
        if wrong:
            problems.append(f"{who}: step() called {', '.join(wrong)}; it should only "
                            "broadcast or all_gather the updated parameters")
        if seen.barriers:
            problems.append(f"{who}: step() waited at {seen.barriers} barrier(s) a step; a "
                            "broadcast already waits for its data")
        if seen.messages:
            problems.append(f"{who}: step() sent or received {len(seen.messages)} messages; "
                            "use broadcast or all_gather")
        elsewhere = sorted({c.ranks for c in seen.collectives
                            if c.ranks is not None and list(c.ranks) != members})
        if elsewhere:
            problems.append(f"{who}: step() ran collectives on global ranks "
                            f"{', '.join(map(str, elsewhere))}; the optimizer's are {members}")
        # torch's functional all_gather is recorded by its input: the output is size times it
        moved = sum(c.nbytes * (size if gathering(c.op) and not c.op.startswith("c10d::")
                                else 1) for c in seen.collectives if sharing(c.op))
        gathers = any(gathering(c.op) for c in seen.collectives)
        if not (moved == needed or (gathers and needed <= moved <= size * fullest)
                or (size == 1 and moved == 0)):
            problems.append(f"{who}: a step() moved {moved} bytes by broadcast / all_gather; "
                            f"sharing the parameters takes {needed} by broadcast, at most "
                            f"{size} x the fullest shard = {size * fullest} by all_gather")
    return problems


# --- l8_pipeline_step ----------------------------------------------------------------------

PIPELINE_RUNS = [(3, 12), (4, 8)]   # (micro-batches, batch)
PIPELINE_GROUP = [0, 1] if WORLD == 2 else [1, 2]   # global ranks of the two stages
HIDDEN = 16


def stages():
    torch.manual_seed(1)
    first = nn.Sequential(nn.Linear(10, HIDDEN), nn.Tanh())
    second = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 5))
    return first, second


def check_pipeline(ex):
    members = PIPELINE_GROUP
    group = None if WORLD == 2 else dist.new_group(members, timeout=GROUP_TIMEOUT)
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
    sizes = sorted({(m.numel, m.nbytes) for m in sent + received})
    if sizes and sizes != [(size, 4 * size)]:
        found = ", ".join(f"{n} elements ({b} bytes)" for n, b in sizes)
        problems.append(f"{run}: messages of {found}; one micro-batch's float32 activation "
                        f"(and its gradient) is {size} elements ({4 * size} bytes)")
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


class RanTheStage(Exception):
    """Raised by a stage that pipeline_step should have refused to run."""


def check_pipeline_refusals(ex):
    """pipeline_step handed what it must refuse: every rank in a group of one; at W = 3 a
    group of all three; in PIPELINE_GROUP, a batch of 10 in 3 micro-batches and a batch of
    8 in 0. Every rank takes part in making every group, in one order. A rank destroys a
    case's group, and lets go of it, as soon as it is done with it: that closes its
    connections, so code that did not refuse and waits for a message from it fails at
    once instead of waiting out the timeout."""
    cases = [("pipeline_group_refused", [r], 8, 2, "in a group of one") for r in range(WORLD)]
    cases += [("pipeline_split_refused", PIPELINE_GROUP, 10, 3,
               "a batch of 10 in 3 micro-batches"),
              ("pipeline_split_refused", PIPELINE_GROUP, 8, 0, "a batch of 8 in 0 micro-batches")]
    if WORLD != 2:
        cases.append(("pipeline_group_refused", list(range(WORLD)), 8, 2,
                      f"in a group of {WORLD}"))
    made = [dist.new_group(ranks, timeout=GROUP_TIMEOUT) for _, ranks, *_ in cases]
    verdicts = {"pipeline_group_refused": [], "pipeline_split_refused": []}
    for i, (verdict, ranks, batch_len, micro, case) in enumerate(cases):
        group, made[i] = made[i], None
        if RANK not in ranks:
            continue
        me = min(ranks.index(RANK), 1)  # in a group of three, ranks 1 and 2 hold stage 1
        verdicts[verdict] += refusal_problems(ex, me, group, batch_len, micro, case)
        dist.destroy_process_group(group)
        still_held = weakref.ref(group)
        del group  # the last reference: its connections close
        if still_held() is not None:  # held in a cycle (a traceback's frames, say)
            gc.collect()
    return {name: (problems, "") for name, problems in verdicts.items()}


def refusal_problems(ex, me, group, batch_len, micro, case):
    """pipeline_step as stage `me` must raise a one-line ValueError before it runs the
    stage or sends or receives anything."""
    def must_not_run(module, args):
        raise RanTheStage(f"rank {RANK}, {case}: the stage ran; pipeline_step must refuse "
                          "its arguments before it runs anything")

    stage = stages()[me]
    stage.register_forward_pre_hook(must_not_run)
    g = torch.Generator().manual_seed(batch_len)
    batch = (torch.randn(batch_len, 10, generator=g) if me == 0
             else torch.randint(0, 5, (batch_len,), generator=g))
    shape = (batch_len // max(micro, 1), HIDDEN)
    who = f"rank {RANK}, stage {me}, {case}"
    seen = Traffic()
    try:
        with seen:
            ex.pipeline_step(stage, batch, micro, shape, group=group)
    except ValueError as error:
        problems = []
        if "\n" in str(error).strip():
            problems.append(f"{who}: the ValueError says more than one line")
        if seen.messages or seen.collectives:
            problems.append(f"{who}: {len(seen.messages)} messages and "
                            f"{len(seen.collectives)} collectives before the ValueError; "
                            "refuse before sending or receiving anything")
        return problems
    except RanTheStage as error:
        return [str(error)]
    except Exception as error:  # the graded code ran: anything may come out
        return [f"{who}: {one_line(error)}, not a ValueError"]
    return [f"{who}: accepted; pipeline_step must raise ValueError"]


# --- the job -------------------------------------------------------------------------------

CHECKS = {"zero1": check_zero1, "zero1_group": check_zero1_group,
          "zero1_idle": check_zero1_idle, "pipeline": check_pipeline,
          "pipeline_refusals": check_pipeline_refusals}
VERDICTS = {"zero1": ["zero1", "zero1_state", "zero1_balance", "zero1_gather"],
            "zero1_group": ["zero1_group"], "zero1_idle": ["zero1_idle"],
            "pipeline": ["pipeline", "pipeline_messages", "pipeline_schedule"],
            "pipeline_refusals": ["pipeline_group_refused", "pipeline_split_refused"]}


def summary(problems: list[str]) -> str:
    return "; ".join(list(dict.fromkeys(problems))[:6])  # the same problem on every rank: once


if __name__ == "__main__":
    grade_each_submission(
        lambda store, tag: run_checks(store, tag, 8, CHECKS, VERDICTS, GROUP_TIMEOUT,
                                      summarise=summary),
        "lesson 8 grading checks")
