"""Run under torchrun by the lesson 7 grading tests: checks the graded code in a real job.

Every check also runs in sub-groups: the ranks split into the even and the odd ones ({0}
and {1} of 2: every rank in a group of one; {0, 2} and {1} of 3), each group running the
graded code at the same time, so code that talks to the whole world instead of its group
gets numbers mixed from both (and no rank waits for a group it is not in).

bucketed: BucketedAllReduce averages the gradients of a plain model for two SGD steps, at
two bucket caps in the world group and at one in each sub-group, next to DDP training a
copy of the model on the same data. While it runs the worker notes every collective the
rank starts (traffic.py's dispatch mode: its bytes and its group), when (during backward
or in finish) and how many gradients were still to come then, and every wait for one.
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

Each check runs in a process group of its own (common.py). Rank 0 prints one line per
verdict: `<name>: ok on W ranks ...` or `<name>: FAILED: ...`. --submissions A,B,...
grades several submission folders, one block after `### submission A` each.
"""

import copy
import re
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
from torch._C._distributed_c10d import Work
from torch.nn.parallel import DistributedDataParallel as DDP
from traffic import NAMESPACES, Traffic

import ddpcourse.runtime  # noqa: F401  before init_process_group: see the comment there

GROUP_TIMEOUT = timedelta(seconds=30)
torch.set_num_threads(1)


def all_reduced(collectives) -> int:
    return sum(c.numel for c in collectives if "allreduce" in c.op or "all_reduce" in c.op)


def sub_groups():
    """(this rank's group, its global ranks): the even ranks and the odd ones, each a group.
    Every rank creates every group (torch requires it), in the same order."""
    parts = [list(range(0, WORLD, 2)), list(range(1, WORLD, 2))]
    groups = [dist.new_group(ranks, timeout=GROUP_TIMEOUT) for ranks in parts]  # not gloo's 30 min
    mine = next(i for i, ranks in enumerate(parts) if RANK in ranks)
    return groups[mine], parts[mine]


def group_name(ranks) -> str:
    return f"the group of ranks {{{', '.join(map(str, ranks))}}}"


def outside_the_group(collectives, ranks) -> list[str]:
    """The collectives that ran on another group than `ranks` (None: not known, not held
    against the code)."""
    return sorted({f"{c.op} on ranks {list(c.ranks)}" for c in collectives
                   if c.ranks is not None and list(c.ranks) != list(ranks)})


# --- l7_bucketed_allreduce ----------------------------------------------------------------

def layered_model(seed=0):
    """Gradient sizes in bytes, registration order: 512 64 1024 64 768 48 192 16."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 4))


# (cap in bytes, index of a parameter to freeze or None). At 1100 bytes the right buckets
# are 1088, 1088 and 512 bytes; filled from the first parameter they would be 576, 1088
# and 1024. At 300 bytes, with the first bias frozen: 5 buckets for 7 parameters.
CONFIGS = [(1100, None), (300, 1)]
STEPS = 2


class Watch:
    """Where the graded code's communication happens: the phase ("backward", "finish"),
    how many gradients are still to come, the all-reduces started, and the waits."""

    def __init__(self):
        self.phase = None
        self.pending = 0
        self.launches = []   # (Collective, phase, pending, async_op)
        self.waits = []      # phase of each Work.wait()


class Launches(Traffic):
    def __init__(self, watch):
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in NAMESPACES:
            name = func._schema.name
            known = len(self.collectives)
            result = super().__torch_dispatch__(func, types, args, kwargs)
            if len(self.collectives) > known:  # a collective, not a wait or a barrier
                # c10d passes async_op positionally when it is False and leaves it out when
                # True (its default)
                async_op = not (name == "c10d::allreduce_" and len(args) > 4 and not args[4])
                w = self.watch
                w.launches.append((self.collectives[-1], w.phase, w.pending, bool(async_op)))
            return result
        return func(*args, **(kwargs or {}))


@contextmanager
def waits_noted(watch):
    """Note the phase of every wait for a collective: Work.wait(), and a wait on its future
    (Work.get_future().wait(), torch.futures.wait_all), which blocks the same way."""
    patched = [(owner, name, vars(owner)[name]) for owner, name in
               [(Work, "wait"), (torch._C.Future, "wait"), (torch.futures.Future, "wait")]]
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


def step_data(step, group_ranks):
    """This rank's batch for a step: different data, even a different size, per rank."""
    g = torch.Generator().manual_seed(1000 * step + RANK)
    n = 5 + group_ranks.index(RANK)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def run_bucketed(ex, cap, frozen, group, group_ranks):
    """Two steps with the graded averager next to DDP; per step the problems and the
    watch."""
    mine, theirs = layered_model(), layered_model()
    for model in (mine, theirs):
        if frozen is not None:
            list(model.parameters())[frozen].requires_grad_(False)
    ddp = DDP(theirs, process_group=group)
    params = [p for p in mine.parameters() if p.requires_grad]
    watch = Watch()

    def noted(param):
        watch.pending -= 1
    for p in params:  # before the graded hooks, so they run first
        p.register_post_accumulate_grad_hook(noted)
    averager = ex.BucketedAllReduce(mine, cap, group=group)
    opt_mine = torch.optim.SGD(mine.parameters(), lr=0.1, momentum=0.9)
    opt_theirs = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    steps = []
    for step in range(STEPS):
        x, y = step_data(step, group_ranks)
        opt_theirs.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt_mine.zero_grad()
        loss = F.cross_entropy(mine(x), y)
        watch.launches, watch.waits, watch.pending = [], [], len(params)
        with Launches(watch), waits_noted(watch):
            watch.phase = "backward"
            loss.backward()
            watch.phase = "finish"
            averager.finish()
            watch.phase = None
        problems = []
        for (name, p), q in zip(mine.named_parameters(), ddp.module.parameters(), strict=True):
            if not p.requires_grad:
                continue
            if p.grad is None or not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6):
                problems.append(f"rank {RANK}, cap {cap} bytes, step {step + 1}: the gradient of "
                                f"{name} differs from DDP's")
                break
        steps.append((problems, copy.deepcopy(watch)))
        opt_mine.step()
        opt_theirs.step()
    return params, steps


def expected_buckets(params, cap):
    """The buckets' bytes by the rule in bucket_assignment's docstring (the grader's own
    copy)."""
    buckets, filled = [], 0
    for p in reversed(params):
        size = p.numel() * p.element_size()
        if buckets and filled + size <= cap:
            buckets[-1] += size
            filled += size
        else:
            buckets.append(size)
            filled = size
    return sorted(buckets)


def bucket_problems(params, cap, where, ranks, watch):
    collectives = [c for c, *_ in watch.launches]
    ops = {c.op for c in collectives}
    if ops - {"c10d::allreduce_"}:
        return [f"{where}: collectives other than all_reduce: {sorted(ops)}"]
    elsewhere = outside_the_group(collectives, ranks)
    if elsewhere:
        return [f"{where}: all-reduces outside {group_name(ranks)}, the group given: "
                f"{elsewhere}"]
    want = expected_buckets(params, cap)
    got = sorted(c.nbytes for c in collectives)
    if got == want:
        return []
    alone = {p.numel() * p.element_size() for p in params}  # over the cap: a bucket alone
    too_big = [n for n in got if n > cap and n not in alone]
    values = sorted(c.numel for c in collectives)
    return [f"{where}: {len(got)} all-reduces of {got} bytes ({values} values); the buckets "
            f"hold {want} bytes of float32 gradients ({len(params)} parameters)"
            + (f"; {too_big} bytes over the cap" if too_big else "")]


def overlap_problems(where, watch):
    launches = watch.launches
    if not launches:
        return [f"{where}: no all-reduce was started"]
    late = [launch for launch in launches if launch[1] != "backward"]
    if late:
        return [f"{where}: {len(late)} of {len(launches)} all-reduces started after backward "
                "(in finish), so none of the communication overlaps backward's computation"]
    blocking = [launch for launch in launches if not launch[-1]]
    if blocking:
        return [f"{where}: {len(blocking)} all-reduces were blocking (async_op=False): "
                "backward stood still while they ran"]
    waited = watch.waits.count("backward")
    if waited:
        return [f"{where}: {waited} waits during backward (Work.wait or its future): the hooks "
                "waited for their all-reduce, so backward stood still while it ran (wait in "
                "finish)"]
    early = sum(1 for _, _, pending, _ in launches if pending > 0)
    if early < len(launches) - 1:
        return [f"{where}: only {early} of {len(launches)} all-reduces started while "
                "gradients were still to come: a bucket's all-reduce starts as soon as its "
                "last gradient arrives"]
    return []


def check_bucketed(ex):
    result, buckets, overlap = [], [], []
    world = list(range(WORLD))
    cases = [(cap, frozen, None, world) for cap, frozen in CONFIGS]
    group, ranks = sub_groups()
    cases.append((CONFIGS[0][0], None, group, ranks))
    counts = []
    for cap, frozen, group, ranks in cases:
        params, steps = run_bucketed(ex, cap, frozen, group, ranks)
        in_group = "" if group is None else f" (in {group_name(ranks)}: the mean over it)"
        for step, (problems, watch) in enumerate(steps):
            where = f"rank {RANK}, cap {cap} bytes, step {step + 1}{in_group}"
            result += [p + in_group for p in problems]
            buckets += bucket_problems(params, cap, where, ranks, watch)
            overlap += overlap_problems(where, watch)
            counts.append(len(watch.launches))
    if result:  # the mechanism counts only with the right gradients
        buckets = overlap = [f"rank {RANK}: the gradients are wrong (see bucketed_result)"]
    note = f"all-reduces per step: {counts}"
    return {"bucketed_result": (result[:1], ""), "bucketed_buckets": (buckets[:1], note),
            "bucketed_overlap": (overlap[:1], "")}


# --- l7_sync_batchnorm --------------------------------------------------------------------

CHANNELS = 3
# Per rank and pass: the statistics (2C + 1 values, float32 or float64; W times over for
# an all_gather, which counts what it receives), never the batch (far more in the first call).
BYTES_PER_RANK = 16 * (CHANNELS + 1)


def batch_of_channels(shape, eps, generator):
    """Channel 0 spread widely; channel 1 near-constant, with a variance near eps, where
    sqrt(var + eps), sqrt(var) + eps and sqrt(var) differ by half or more; channel 2
    constant, variance exactly 0 (0.5 and its square are exact in float32, so every right
    way of computing it gets 0)."""
    x = torch.randn(shape, generator=generator)
    x[:, 0] = x[:, 0] * 2 + 1.5
    x[:, 1] = x[:, 1] * (0.8 * eps ** 0.5) + 0.02
    x[:, 2] = 0.5
    return x


def per_channel(values, like):
    return values.view(1, -1, *[1] * (like.dim() - 2))


def sync_bn_call(ex, call, group, ranks, buffers, generator):
    """One call of the graded code on this rank's rows of a batch split over the group,
    against F.batch_norm (in float64) on the whole batch. Returns the problems per verdict
    (forward, backward, traffic) and where."""
    sizes, extra, momentum, eps = call
    shape = (sum(sizes), CHANNELS, *extra)
    x_all = batch_of_channels(shape, eps, generator)
    dy_all = torch.randn(shape, generator=generator)
    weight0 = torch.rand(CHANNELS, generator=generator) + 0.5
    bias0 = torch.randn(CHANNELS, generator=generator)
    position = ranks.index(RANK)
    lo, hi = sum(sizes[:position]), sum(sizes[:position + 1])
    where = (f"rank {RANK}, input {(hi - lo, *shape[1:])}, eps {eps:g}, momentum {momentum:g}"
             + ("" if group is None else f", in {group_name(ranks)}"))
    (mean_ref, var_ref), (mean_mine, var_mine) = buffers
    # the reference: BatchNorm on the group's batches together, in float64
    x_ref = x_all.double().requires_grad_(True)
    w_ref = weight0.double().requires_grad_(True)
    b_ref = bias0.double().requires_grad_(True)
    y_ref = F.batch_norm(x_ref, mean_ref, var_ref, w_ref, b_ref, training=True,
                         momentum=momentum, eps=eps)
    (y_ref * dy_all.double()).sum().backward()
    x_hat = ((y_ref - per_channel(b_ref, x_ref)) / per_channel(w_ref, x_ref)).detach()
    dims = [0, *range(2, x_all.dim())]
    w_share = (dy_all[lo:hi] * x_hat[lo:hi]).sum(dims)
    b_share = dy_all[lo:hi].sum(dims)
    # the graded code on this rank's rows
    x = x_all[lo:hi].clone().requires_grad_(True)
    w, b = weight0.clone().requires_grad_(True), bias0.clone().requires_grad_(True)
    forward, backward, traffic = [], [], []
    with Traffic() as seen_forward:
        y = ex.sync_batch_norm(x, mean_mine, var_mine, w, b, momentum=momentum, eps=eps,
                               group=group)
    want = y_ref[lo:hi].float()
    if not torch.allclose(y, want, rtol=1e-4, atol=1e-4):
        worst = (y - want).abs().amax(dim=dims)
        forward.append(f"{where}: the output differs from BatchNorm's on the group's batches "
                       f"by up to {[f'{v:.1e}' for v in worst.tolist()]} in channels 0, 1 "
                       "(variance near eps), 2 (constant)")
    with Traffic() as seen_backward:
        (y * dy_all[lo:hi]).sum().backward()
    for name, got, want in [("input", x.grad, x_ref.grad[lo:hi]),
                            ("weight", w.grad, w_share), ("bias", b.grad, b_share)]:
        if got is None or not torch.allclose(got, want.float(), rtol=1e-4, atol=1e-4):
            backward.append(f"{where}: the gradient of {name} is wrong" + (
                "" if name == "input" else " (this rank's share: the sum over its own "
                "values)"))
            break
    most = BYTES_PER_RANK * len(ranks)
    for seen, part in ((seen_forward, "forward"), (seen_backward, "backward")):
        sent = sum(c.nbytes for c in seen.collectives)
        elsewhere = outside_the_group(seen.collectives, ranks)
        if elsewhere:
            traffic.append(f"{where}: the {part} ran collectives outside "
                           f"{group_name(ranks)}, the group given: {elsewhere}")
        elif sent > most:
            traffic.append(f"{where}: the {part} communicated {sent} bytes; the statistics of "
                           f"{CHANNELS} channels on {len(ranks)} ranks take at most {most} "
                           f"(this rank's input holds {x.numel() * x.element_size()})")
    return forward, backward, traffic


# (the ranks' batch sizes, the dimensions after C, momentum, eps) of each call
WORLD_CALLS = [([2 + 3 * r for r in range(WORLD)], (4, 4), 0.1, 1e-5),
               ([1 + 3 * r for r in range(WORLD)], (), 0.3, 1e-3)]


def check_sync_bn(ex):
    forward, backward, running, traffic = [], [], [], []
    group, ranks = sub_groups()
    for in_group in (False, True):
        g = torch.Generator().manual_seed(11 + (ranks[0] if in_group else WORLD))
        calls = ([([4 + 2 * i for i in range(len(ranks))], (3,), 0.2, 1e-4)] if in_group
                 else WORLD_CALLS)
        buffers = ((torch.zeros(CHANNELS, dtype=torch.float64),
                    torch.ones(CHANNELS, dtype=torch.float64)),
                   (torch.zeros(CHANNELS), torch.ones(CHANNELS)))
        for call in calls:
            problems = sync_bn_call(ex, call, group if in_group else None,
                                    ranks if in_group else list(range(WORLD)), buffers, g)
            for found, verdict in zip(problems, (forward, backward, traffic), strict=True):
                verdict += found
        where = f"rank {RANK}" + (f", in {group_name(ranks)}" if in_group else "")
        (mean_ref, var_ref), (mean_mine, var_mine) = buffers
        for name, got, want in [("running_mean", mean_mine, mean_ref),
                                ("running_var", var_mine, var_ref)]:
            if not torch.allclose(got, want.float(), rtol=1e-5, atol=1e-5):
                running.append(f"{where}: {name} is {[round(v, 5) for v in got.tolist()]}, "
                               f"BatchNorm's {[round(v, 5) for v in want.tolist()]}"
                               + (" (the unbiased variance?)" if name == "running_var" else ""))
    if forward or backward:  # the mechanism counts only with the right numbers
        traffic = [f"rank {RANK}: the output or the gradients are wrong (see sync_bn_forward "
                   "and sync_bn_backward)"]
    return {"sync_bn_forward": (forward[:1], ""), "sync_bn_backward": (backward[:1], ""),
            "sync_bn_running": (running[:1], ""), "sync_bn_traffic": (traffic[:1], "")}


# --- l7_accumulate_no_sync ----------------------------------------------------------------

K, MICRO, OPT_STEPS = 3, 4, 2


def small_model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))


def micro_batches(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return [(torch.randn(MICRO, 10, generator=g), torch.randint(0, 3, (MICRO,), generator=g))
            for _ in range(K)]


def mean_loss(model, batches) -> float:
    """The mean of loss_fn over the micro-batches, with the model as it is now."""
    with torch.no_grad():
        return sum(F.cross_entropy(model(x), y).item() for x, y in batches) / len(batches)


def loss_problem(got, want, where) -> list[str]:
    if not isinstance(got, float):
        return [f"{where}: accumulation_step returned a {type(got).__name__}, not a float"]
    if abs(got - want) > 1e-5 * max(1.0, abs(want)):
        return [f"{where}: accumulation_step returned {got:.6f}; this rank's mean loss over "
                f"its K micro-batches, before the step, is {want:.6f}"]
    return []


def check_accumulate(ex):
    model = small_model()
    start = copy.deepcopy(model)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    params = sum(p.numel() for p in model.parameters())
    per_step, losses = [], []
    for step in range(OPT_STEPS):
        batches = micro_batches(step, RANK)
        want = mean_loss(model, batches)  # with the parameters this step starts from
        with Traffic() as seen:
            got = ex.accumulation_step(ddp, optimizer, batches, F.cross_entropy)
        per_step.append(all_reduced(seen.collectives))
        losses += loss_problem(got, want, f"rank {RANK}, step {step + 1}")
    reference = copy.deepcopy(start)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(OPT_STEPS):
        pairs = [pair for r in range(WORLD) for pair in micro_batches(step, r)]
        x, y = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
        ref_opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        ref_opt.step()
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = torch.cat([p.detach().flatten() for p in reference.parameters()])
    diff = (mine - ref).abs().max().item()
    result = []
    if diff > 1e-5:
        result.append(f"rank {RANK}: after {OPT_STEPS} steps of K={K} micro-batches the "
                      f"parameters differ from one process on the big batches by {diff:.2e}")
    everyone = [torch.empty_like(mine) for _ in range(WORLD)]
    dist.all_gather(everyone, mine)
    if not all(torch.equal(e, mine) for e in everyone):
        result.append(f"rank {RANK}: the ranks ended with different parameters")
    allreduce = []
    if result:
        allreduce = [f"rank {RANK}: the result is wrong (see accumulate_result)"]
    elif any(not params <= n < 2 * params for n in per_step):
        allreduce = [f"rank {RANK}: gradient values all-reduced per optimizer step: "
                     f"{per_step}; the {params} parameters once each is {params} (K={K} "
                     "micro-batches: no_sync on all but the last)"]
    return {"accumulate_result": (result, f"max difference {diff:.1e}"),
            "accumulate_allreduce": (allreduce, f"values all-reduced per step: {per_step}"),
            "accumulate_loss": (losses[:1], "")}


CHECKS = {"bucketed": check_bucketed, "sync_bn": check_sync_bn, "accumulate": check_accumulate}
VERDICTS = {"bucketed": ["bucketed_result", "bucketed_buckets", "bucketed_overlap"],
            "sync_bn": ["sync_bn_forward", "sync_bn_backward", "sync_bn_running",
                        "sync_bn_traffic"],
            "accumulate": ["accumulate_result", "accumulate_allreduce", "accumulate_loss"]}


def summary(problems: list[str]) -> str:
    """The ranks' problems, each told once with the ranks that had it."""
    ranks_of: dict[str, list[str]] = {}
    for problem in problems:
        match = re.match(r"rank (\d+)(, |: )(.*)", problem)
        text, rank = (match.group(3), match.group(1)) if match else (problem, None)
        ranks_of.setdefault(text, [])
        if rank is not None:
            ranks_of[text].append(rank)
    told = [(f"rank{'s' if len(r) > 1 else ''} {', '.join(r)}: " if r else "") + text
            for text, r in ranks_of.items()]
    return "; ".join(told[:3]) + (f"; and {len(told) - 3} more" if len(told) > 3 else "")


if __name__ == "__main__":
    grade_each_submission(
        lambda store, tag: run_checks(store, tag, 7, CHECKS, VERDICTS, GROUP_TIMEOUT,
                                      summarise=summary),
        "lesson 7 grading checks")
