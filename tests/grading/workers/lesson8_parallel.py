"""Run under torchrun by the lesson 8 grading tests, in the submission's sandbox:
Zero1Optimizer in a real job, with every collective and message the graded
code starts recorded (traffic.py). Each rank reports what it saw (parameters, gradients, the
optimizers the code made and what they hold, the traffic of each step, what each refusal
raised); tests/grading/test_lesson8.py computes the references and decides the verdicts below.

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
  zero1_idle     more ranks than parameters: the rank that owns none makes no optimizer,
                 the parameters still end right everywhere, and step() moves what zero1_gather
                 allows.

pipeline_step runs in relayed jobs of its own: workers/lesson8_pipeline.py.

Each check runs in a process group of its own (common.py); rank 0 writes every rank's
observations for the judge. --submissions A,B,... grades several submission folders.
"""

import importlib
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import RANK, WORLD, observe_each_submission
from probes import (
    ZERO_BATCH,
    ZERO_STEPS,
    lesson8_idle_model,
    lesson8_zero_batch,
)
from probes import lesson8_zero_model as zero_model
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from traffic import Traffic

import ddpcourse.runtime  # noqa: F401  before init_process_group: see the comment there

GROUP_TIMEOUT = timedelta(seconds=30)  # as the other lessons: room for a loaded machine
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


class StepTraffic(Traffic):
    """Traffic, and the barriers it leaves out: they move no data, but a barrier in every
    step is a wait that ZeRO-1's broadcasts (which wait for their data) do not need."""

    BARRIERS = ("c10d::barrier", "c10d::monitored_barrier_")

    def __init__(self):
        super().__init__()
        self.barriers = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # an operator's full name: only its schema has it
        if func.namespace == "c10d" and func._schema.name in self.BARRIERS:
            self.barriers += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


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
    each step()'s traffic)."""
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
            with StepTraffic() as seen:
                zero.step()
            steps.append(seen)
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


def step_traffic(seen) -> dict:
    return {"collectives": [(c.op, int(c.numel), int(c.nbytes),
                             None if c.ranks is None else list(c.ranks))
                            for c in seen.collectives],
            "barriers": seen.barriers, "messages": len(seen.messages)}


def observe_zero1(ex):
    """In the world: SGD with momentum, then Adam."""
    runs = []
    for optimizer_class, defaults, _ in OPTIMIZERS:
        zero, made, model, _, steps = zero1_run(ex, zero_model, optimizer_class, defaults)
        runs.append({"parameters": flat(model), **zero1_facts(zero, made, model),
                     "steps": [step_traffic(seen) for seen in steps]})
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
            "steps": [step_traffic(seen) for seen in steps]}


def observe_zero1_idle(ex):
    """More ranks than parameters: the last rank owns none, makes no optimizer, and still
    takes part in the sharing."""
    zero, made, model, _, steps = zero1_run(ex, idle_model, torch.optim.SGD,
                                            {"lr": 0.1, "momentum": 0.9})
    return {"parameters": flat(model), **zero1_facts(zero, made, model),
            "steps": [step_traffic(seen) for seen in steps]}


# --- the job -------------------------------------------------------------------------------

CHECKS = {"zero1": observe_zero1, "zero1_group": observe_zero1_group,
          "zero1_idle": observe_zero1_idle}


if __name__ == "__main__":
    observe_each_submission(8, CHECKS, GROUP_TIMEOUT, "lesson 8 grading checks")
