"""Run by the lesson 8 grading tests as the ranks of a relayed job (W = 2 and 3): one check
per job, each rank in a sandbox of its own whose only road to the others is the relay
(ddpcourse/course/relay.py); tests/grading/test_lesson8.py computes the references and
decides the verdicts below. Each rank reports what the graded code left (parameters,
gradients, the optimizers it made and what they hold, what each refusal raised); every
collective and message (its bytes, its group, its order) is the relay's record, one case per
step() or pipeline run.

Zero1Optimizer: a DDP model trains a few steps with Zero1Optimizer, beside the same model
trained by the plain optimizer on the whole batch in the judge. The optimizer class
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
  zero1_idle     more ranks than parameters: the rank that owns none makes no optimizer,
                 the parameters still end right everywhere, and step() moves what zero1_gather
                 allows.

pipeline_step: a small model is cut into two stages; group ranks 0 and 1 of a two-rank group
run them (the world at W = 2; the group of global ranks 1 and 2 at W = 3, where rank 0 looks
on), with 3 and then 4 micro-batches, onto gradients already there. Stage 0's inputs and stage
1's labels come from each one's secret (probes.lesson8_pipeline_batch), so neither stage can
compute the other's side: activations and gradients must travel.
  pipeline           one case per run: the gradients, what was returned; the messages;
  pipeline_refusals  pipeline_step handed what it must refuse: every rank in a group of one;
                     at W = 3 a group of all three; in the two stages' group, a batch of 10
                     in 3 micro-batches and a batch of 8 in 0. One case each: what it raised,
                     and the relay's messages and collectives meanwhile.

    python ddpcourse/course/workers/lesson8_parallel.py --check zero1   (as a relayed rank)
"""

import importlib
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse.course.probes import (
    HIDDEN,
    PIPELINE_RUNS,
    ZERO_BATCH,
    ZERO_STEPS,
    lesson8_idle_model,
    lesson8_pipeline_batch,
    lesson8_zero_batch,
)
from ddpcourse.course.probes import lesson8_stages as stages
from ddpcourse.course.probes import lesson8_zero_model as zero_model
from ddpcourse.course.workers import common
from ddpcourse.course.workers.common import RANK, WORLD, case, end_case, one_line, relayed_rank

GROUP_TIMEOUT = timedelta(seconds=30)  # as the other lessons: room for a loaded machine
# A pipeline refusal case's group: a stage that did not refuse and waits for the other, which
# did (or ran its stage and was stopped), fails after this, well inside the check's alarm.
REFUSAL_TIMEOUT = timedelta(seconds=3)
torch.set_num_threads(1)


# --- l8_zero1_optimizer --------------------------------------------------------------------

OPTIMIZERS = [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, 1),   # (class, defaults,
              (torch.optim.Adam, {"lr": 0.01}, 2)]                    #  state buffers)
ZERO_GROUP = [1] if WORLD == 2 else [1, 2]   # global ranks: group rank 0 is not global 0


def idle_model():
    return lesson8_idle_model(WORLD)


def recording(optimizer_class):
    """A subclass of optimizer_class that notes each instance made of it."""
    made = []

    class Recorded(optimizer_class):
        def __init__(self, params, *args, **kwargs):
            super().__init__(params, *args, **kwargs)
            made.append(self)

    Recorded.__name__ = optimizer_class.__name__
    return Recorded, made


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
    not told of a group) with Zero1Optimizer: (zero, the optimizers it made, the model, None,
    each step()'s case, whose collectives and messages are the relay's)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    model = make_model()
    wrapped = DDP(model, process_group=group)
    Recorded, made = recording(optimizer_class)
    in_group = {} if group is None else {"group": group}
    with ready_made_zero_refused(ex):
        zero = made_on_every_rank(
            lambda: ex.Zero1Optimizer(model.parameters(), Recorded, **in_group, **defaults),
            group)
        share = slice(rank * ZERO_BATCH // size, (rank + 1) * ZERO_BATCH // size)
        steps = []
        for step in range(ZERO_STEPS):
            x, y = lesson8_zero_batch(step)
            F.cross_entropy(wrapped(x[share]), y[share]).backward()  # DDP averages the grads
            steps.append(case())
            zero.step()
            end_case()
            zero.zero_grad()
    return zero, made, model, None, steps


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


def zero1_facts(zero, made, model):
    """What the optimizer holds, as data: parameters named by their index in the model
    (-1: an object that is none of them)."""
    index = {id(p): i for i, p in enumerate(model.parameters())}
    params = list(getattr(zero, "params", []))
    owners = getattr(zero, "owners", None)
    try:
        owners = [int(o) if isinstance(o, int) and not isinstance(o, bool) else None
                  for o in owners]
    except TypeError:
        owners = None
    inner = getattr(zero, "optimizer", None)
    stepped = [index.get(id(p), -1) for o in made for group in o.param_groups
               for p in group["params"]]
    state = [(index.get(id(p), -1), sum(v.numel() for v in s.values()
                                          if torch.is_tensor(v) and v.shape == p.shape))
             for o in made for p, s in o.state.items()]
    return {"params_given": [id(p) for p in params] == [id(p) for p in model.parameters()],
            "owners": owners, "made": len(made), "inner_none": inner is None,
            "inner_is_made": bool(made) and made[0] is inner, "stepped": stepped,
            "state": state}


def observe_zero1(ex):
    """In the world: SGD with momentum, then Adam."""
    runs = []
    for optimizer_class, defaults, _ in OPTIMIZERS:
        zero, made, model, _, steps = zero1_run(ex, zero_model, optimizer_class, defaults)
        runs.append({"parameters": flat(model), **zero1_facts(zero, made, model),
                     "steps": steps})
    return runs


def observe_zero1_group(ex):
    """Adam in the sub-group ZERO_GROUP, which every rank takes part in making; the other
    ranks look on."""
    group = dist.new_group(ZERO_GROUP, timeout=GROUP_TIMEOUT)
    if RANK not in ZERO_GROUP:
        return None
    zero, made, model, _, steps = zero1_run(ex, zero_model, torch.optim.Adam,
                                            {"lr": 0.01}, group)
    return {"parameters": flat(model), **zero1_facts(zero, made, model),
            "steps": steps}


def observe_zero1_idle(ex):
    """More ranks than parameters: the last rank owns none, makes no optimizer, and still
    takes part in the sharing."""
    zero, made, model, _, steps = zero1_run(ex, idle_model, torch.optim.SGD,
                                            {"lr": 0.1, "momentum": 0.9})
    return {"parameters": flat(model), **zero1_facts(zero, made, model),
            "steps": steps}


# --- l8_pipeline_step ----------------------------------------------------------------------

PIPELINE_GROUP = [0, 1] if WORLD == 2 else [1, 2]   # global ranks of the two stages


def returned_facts(returned) -> dict:
    if returned is None:
        return {"kind": "None"}
    if not torch.is_tensor(returned):
        return {"kind": type(returned).__name__, "shown": f"{returned!r:.60}"}
    return {"kind": "tensor", "dim": returned.dim(), "shown": f"{returned!r:.60}",
            "graph": returned.grad_fn is not None or returned.requires_grad,
            "value": returned.detach().reshape(-1)[:1].clone()}


def observe_pipeline(ex):
    members = PIPELINE_GROUP
    group = None if WORLD == 2 else dist.new_group(members, timeout=GROUP_TIMEOUT)
    if RANK not in members:
        return None
    me = members.index(RANK)
    runs = []
    for micro, batch in PIPELINE_RUNS:
        mine = lesson8_pipeline_batch(common.SECRET, micro, batch)[me]
        stage = stages()[me]
        for p in stage.parameters():
            p.grad = torch.full_like(p, 0.5)  # gradients already there: a step adds to them
        shape = (batch // micro, HIDDEN)
        run = case()
        returned = ex.pipeline_step(stage, mine, micro, shape, group=group)
        runs.append(dict(run, grads=[p.grad for p in stage.parameters()],
                         returned=returned_facts(returned)))
    return runs


class RanTheStage(Exception):
    """Raised by a stage that pipeline_step should have refused to run."""


def observe_pipeline_refusals(ex):
    """[(verdict, what happened)] on this rank, for every case it takes part in; every rank
    makes every case's group, in one order."""
    cases = [("pipeline_group_refused", [r], 8, 2, "in a group of one") for r in range(WORLD)]
    cases += [("pipeline_split_refused", PIPELINE_GROUP, 10, 3,
               "a batch of 10 in 3 micro-batches"),
              ("pipeline_split_refused", PIPELINE_GROUP, 8, 0, "a batch of 8 in 0 micro-batches")]
    if WORLD != 2:
        cases.append(("pipeline_group_refused", list(range(WORLD)), 8, 2,
                      f"in a group of {WORLD}"))
    made = [dist.new_group(ranks, timeout=REFUSAL_TIMEOUT) for _, ranks, *_ in cases]
    outcomes = []
    for (verdict, ranks, batch_len, micro, what), group in zip(cases, made, strict=True):
        if RANK in ranks:
            me = min(ranks.index(RANK), 1)  # in a group of three, ranks 1 and 2 hold stage 1
            outcomes.append((verdict, refusal_outcome(ex, me, group, batch_len, micro, what)))
    return outcomes


def refusal_outcome(ex, me, group, batch_len, micro, what):
    """What pipeline_step as stage `me` did with arguments it must refuse (a one-line
    ValueError before it runs the stage or sends or receives anything)."""
    def must_not_run(module, args):
        raise RanTheStage(f"rank {RANK}, {what}: the stage ran; pipeline_step must refuse "
                          "its arguments before it runs anything")

    stage = stages()[me]
    stage.register_forward_pre_hook(must_not_run)
    g = torch.Generator().manual_seed(batch_len)
    batch = (torch.randn(batch_len, 10, generator=g) if me == 0
             else torch.randint(0, 5, (batch_len,), generator=g))
    shape = (batch_len // max(micro, 1), HIDDEN)
    seen = dict(case(), who=f"rank {RANK}, stage {me}, {what}")
    try:
        ex.pipeline_step(stage, batch, micro, shape, group=group)
    except ValueError as error:
        return dict(seen, raised="ValueError", one_line="\n" not in str(error).strip())
    except RanTheStage as error:
        return dict(seen, raised="RanTheStage", text=str(error))
    except Exception as error:  # the graded code ran: anything may come out
        return dict(seen, raised="other", text=one_line(error))
    return dict(seen, raised=None)


CHECKS = {name: (observe, GROUP_TIMEOUT) for name, observe in {
    "zero1": observe_zero1, "zero1_group": observe_zero1_group,
    "zero1_idle": observe_zero1_idle, "pipeline": observe_pipeline,
    "pipeline_refusals": observe_pipeline_refusals}.items()}


if __name__ == "__main__":
    relayed_rank(8, CHECKS, "one lesson 8 grading check, as a relayed rank")
