"""Run by the lesson 7 grading tests as the ranks of a relayed job (W = 2 and 3): one check
per job, each rank in a sandbox of its own whose only road to the others is the relay
(ddpcourse/course/relay.py); tests/grading/test_lesson7.py computes the references (DDP's
mean, BatchNorm on the group's batches, one process on the big batches) and decides each
verdict below. Every rank's data come from a secret the relay gave it alone, so no rank can
compute another's gradients or statistics: they must travel. A rank reports what the graded
code left (gradients, outputs, buffers, parameters) and, for the overlap, when each
all-reduce started and every wait (inside the rank: no one else can see its backward); every
collective's bytes and group are the relay's record, one case per step or pass.

Every check also runs in sub-groups: the ranks split into the even and the odd ones ({0}
and {1} of 2: every rank in a group of one; {0, 2} and {1} of 3), each group running the
graded code at the same time, so code that talks to the whole world instead of its group
gets numbers mixed from both (and no rank waits for a group it is not in).

bucketed: BucketedAllReduce averages the gradients of a plain model for two SGD steps, at
two bucket caps in the world group and at one in each sub-group, next to DDP training a
copy of the model on the same data. While it runs the worker notes every collective the
rank starts (at the relay group's methods, in the rank), when (during backward or in
finish) and how many gradients were still to come then, and every wait for one.
  bucketed_result   after finish() the gradients equal DDP's (the mean over the group),
                    step after step;
  bucketed_buckets  one all-reduce per bucket per step, on the group given, of exactly
                    the buckets' BYTES (bucket_assignment's rule on float32 gradients: a
                    bucket sent as float64 is twice its size), none bigger than the cap;
  bucketed_overlap  every all-reduce started during backward with async_op=True, all but
                    the last while gradients were still to come, none waited for until
                    backward was over.
  The mechanism counts only with the right gradients.
sync_bn: every rank normalises its own batch (of a size that differs from rank to rank,
a single sample on rank 0 once) with sync_batch_norm: (N, C, H, W) then (N, C) in the world
group, then (N, C, L) in the sub-groups, with eps and momentum other than the defaults.
Channel 0 is spread widely, channel 1 has a variance near eps (so where eps goes shows)
and channel 2 is constant (variance 0: eps alone keeps 1 / sqrt(var + eps) finite). The
reference is F.batch_norm on the group's batches concatenated.
  sync_bn_forward   the outputs;
  sync_bn_backward  the input's gradient, and this rank's share of weight's and bias's;
  sync_bn_running   the running mean and the running (unbiased) variance;
  sync_bn_traffic   forward and backward each communicate O(channels) bytes: at most
                    16 (C + 1) x the group's ranks, whatever the batch, and only on the
                    group given (and forward and backward are right).
accumulate: accumulation_step trains a DDP model for two optimizer steps of K = 3
micro-batches per rank; the reference is one process on each step's big batch.
  accumulate_result     the parameters equal the reference's, on every rank;
  accumulate_allreduce  each step all-reduced the parameters' worth of gradient values
                        once: not K times (no no_sync), not zero times;
  accumulate_loss       each step returned this rank's mean of its K micro-batches'
                        losses, computed with the parameters the step started from.

    python ddpcourse/course/workers/lesson7_checks.py --check bucketed   (as a relayed rank)
"""

import sys
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse.course.probes import (
    CHANNELS,
    CONFIGS,
    STEPS,
    WORLD_SYNC_BN_CALLS,
    layered_model,
    lesson7_micro_batches,
    lesson7_small_model,
    lesson7_step_data,
    sub_group_parts,
    sync_bn_group_calls,
    sync_bn_inputs,
)
from ddpcourse.course.relay import RelayGroup, RelayWork
from ddpcourse.course.workers import common
from ddpcourse.course.workers.common import RANK, WORLD, case, relayed_rank

# The relay group's methods that start a collective (all but send and recv; the others, as
# allreduce_coalesced, call one of these).
COLLECTIVE_METHODS = ("allreduce", "broadcast", "allgather",
                      "_allgather_base", "reduce_scatter", "_reduce_scatter_base",
                      "alltoall_base", "alltoall", "gather", "scatter", "reduce")

GROUP_TIMEOUT = timedelta(seconds=30)
torch.set_num_threads(1)


def sub_groups():
    """(this rank's group, its global ranks): the even ranks and the odd ones, each a group.
    Every rank creates every group (torch requires it), in the same order."""
    parts = sub_group_parts(WORLD)
    groups = [dist.new_group(ranks, timeout=GROUP_TIMEOUT) for ranks in parts]  # not gloo's 30 min
    mine = next(i for i, ranks in enumerate(parts) if RANK in ranks)
    return groups[mine], parts[mine]


# --- l7_bucketed_allreduce ----------------------------------------------------------------

class Watch:
    """Where the graded code's communication happens: the phase ("backward", "finish"),
    how many gradients are still to come, the all-reduces started, and the waits."""

    def __init__(self):
        self.phase = None
        self.pending = 0
        self.launches = []   # (phase, pending, async_op)
        self.waits = []      # phase of each Work.wait()


@contextmanager
def launches_noted(watch):
    """Note every collective the rank starts: when (the phase), how many gradients were still
    to come, and whether the caller waits for it at once (dist.all_reduce's async_op). Every
    road to a collective ends at one of the relay group's methods in this process."""
    def noting(real):
        def start(self, *args, **kwargs):
            asked = next((frame.f_locals.get("async_op") for frame in _callers()
                          if frame.f_code.co_filename == c10d.__file__
                          and "async_op" in frame.f_locals), True)
            watch.launches.append((watch.phase, watch.pending, bool(asked)))
            return real(self, *args, **kwargs)
        return start

    saved = {name: vars(RelayGroup)[name] for name in COLLECTIVE_METHODS}
    for name, real in saved.items():
        setattr(RelayGroup, name, noting(real))
    try:
        yield
    finally:
        for name, real in saved.items():
            setattr(RelayGroup, name, real)


def _callers():
    frame = sys._getframe(2)
    while frame is not None:
        yield frame
        frame = frame.f_back


@contextmanager
def waits_noted(watch):
    """Note the phase of every wait for a collective: Work.wait(), and a wait on its future
    (Work.get_future().wait(), torch.futures.wait_all), which blocks the same way."""
    patched = [(owner, name, vars(owner)[name]) for owner, name in
               [(dist.Work, "wait"), (RelayWork, "wait"),  # the relay's works wait in Python
                (torch._C.Future, "wait"),  # the C++ future's own wait
                (torch.futures.Future, "wait")]]
    real_wait_all = torch.futures.wait_all

    def noting(real):
        def wait(*args, **kwargs):
            watch.waits.append(watch.phase)
            return real(*args, **kwargs)
        return wait

    for owner, name, real in patched:
        setattr(owner, name, noting(real))
    torch.futures.wait_all = noting(real_wait_all)
    try:
        yield
    finally:
        for owner, name, real in patched:
            setattr(owner, name, real)
        torch.futures.wait_all = real_wait_all


def run_bucketed(ex, cap, frozen, group, group_ranks):
    """Two SGD steps with the graded averager: per step the gradients after finish() and
    what the watch saw."""
    mine = layered_model()
    if frozen is not None:
        list(mine.parameters())[frozen].requires_grad_(False)
    params = [p for p in mine.parameters() if p.requires_grad]
    watch = Watch()

    def noted(param):
        watch.pending -= 1
    for p in params:  # before the graded hooks, so they run first
        p.register_post_accumulate_grad_hook(noted)
    averager = ex.BucketedAllReduce(mine, cap, group=group)
    opt_mine = torch.optim.SGD(mine.parameters(), lr=0.1, momentum=0.9)
    steps = []
    for step in range(STEPS):
        x, y = lesson7_step_data(step, group_ranks, RANK, common.SECRET)
        opt_mine.zero_grad()
        loss = F.cross_entropy(mine(x), y)
        watch.launches, watch.waits, watch.pending = [], [], len(params)
        seen = case()
        with launches_noted(watch), waits_noted(watch):
            watch.phase = "backward"
            loss.backward()
            watch.phase = "finish"
            averager.finish()
            watch.phase = None
        steps.append(dict(seen, grads=[p.grad for p in mine.parameters()],
                          launches=list(watch.launches),
                          waits=list(watch.waits)))
        opt_mine.step()
    return steps


def observe_bucketed(ex):
    world = list(range(WORLD))
    cases = [(cap, frozen, None, world) for cap, frozen in CONFIGS]
    group, ranks = sub_groups()
    cases.append((CONFIGS[0][0], None, group, ranks))
    return [run_bucketed(ex, cap, frozen, group, ranks) for cap, frozen, group, ranks in cases]


# --- l7_sync_batchnorm --------------------------------------------------------------------

def sync_bn_call(ex, call, group, ranks, buffers, generator, index):
    """One call of the graded code on this rank's rows of a batch split over the group: its
    output and gradients; the forward and the backward a case each (the judge builds the
    same batch from every member's secret)."""
    _, _, momentum, eps = call
    x_all, dy_all, weight0, bias0, lo, hi = sync_bn_inputs(
        call, ranks, RANK, generator, {RANK: common.SECRET}, index)
    mean_mine, var_mine = buffers
    x = x_all[lo:hi].clone().requires_grad_(True)
    w, b = weight0.clone().requires_grad_(True), bias0.clone().requires_grad_(True)
    forward = case()
    y = ex.sync_batch_norm(x, mean_mine, var_mine, w, b, momentum=momentum, eps=eps,
                           group=group)
    backward = case()
    (y * dy_all[lo:hi]).sum().backward()
    return {"y": y, "x_grad": x.grad, "w_grad": w.grad, "b_grad": b.grad,
            "forward": forward, "backward": backward}


def observe_sync_bn(ex):
    group, ranks = sub_groups()
    runs, index = [], 0
    for in_group in (False, True):
        g = torch.Generator().manual_seed(11 + (ranks[0] if in_group else WORLD))
        calls = sync_bn_group_calls(len(ranks)) if in_group else WORLD_SYNC_BN_CALLS(WORLD)
        buffers = (torch.zeros(CHANNELS), torch.ones(CHANNELS))
        observed = []
        for call in calls:
            observed.append(sync_bn_call(ex, call, group if in_group else None,
                                         ranks if in_group else list(range(WORLD)), buffers,
                                         g, index))
            index += 1
        runs.append({"calls": observed, "running_mean": buffers[0],
                     "running_var": buffers[1]})
    return runs


# --- l7_accumulate_no_sync ----------------------------------------------------------------

def observe_accumulate(ex):
    model = lesson7_small_model()
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    steps = []
    for step in range(OPT_STEPS):
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}
        seen = case()
        got = ex.accumulation_step(ddp, optimizer, lesson7_micro_batches(step, common.SECRET),
                                   F.cross_entropy)
        steps.append(dict(seen, start=start, returned=got))
    return {"steps": steps,
            "parameters": torch.cat([p.detach().flatten() for p in model.parameters()])}


OPT_STEPS = 2
CHECKS = {name: (observe, GROUP_TIMEOUT) for name, observe in {
    "bucketed": observe_bucketed, "sync_bn": observe_sync_bn,
    "accumulate": observe_accumulate}.items()}


if __name__ == "__main__":
    relayed_rank(7, CHECKS, "one lesson 7 grading check, as a relayed rank")
