"""Grading tests for lesson 7. bucket_assignment is checked against the rule in its
docstring; BucketedAllReduce against DDP and, for most of its points, by its mechanism: one
all-reduce per bucket, of the bucket's bytes, on the group given, started in backward as the
bucket fills and not waited for there; sync_batch_norm against BatchNorm on every rank's
batch together (with channels where the place of eps shows), and by what it communicates
(the statistics, never the batch, only within the group given); accumulation_step against
one process on the big batch, by which forwards run outside no_sync (a stand-in for DDP, in
this process), by the gradient values the real DDP all-reduces per optimizer step, and by
the loss it returns. The checks that need several ranks run at 2 and 3 ranks as relayed jobs,
one per check (workers/lesson7_checks.py: every rank a sandbox of its own, its data from a
secret of its own, the relay in this process the only road between them), in the world group
and in sub-groups of it: every collective's bytes and group are the relay's record; when each
all-reduce started and what waited, inside one rank's backward, the rank's."""


import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ddpcourse.course.jobs import (
    graded,
    judge_once,
    relayed_report,
    verdict,
)
from ddpcourse.course.probes import (
    CHANNELS,
    CONFIGS,
    STEPS,
    WORLD_SYNC_BN_CALLS,
    accumulation_data,
    layered_model,
    lesson7_micro_batches,
    lesson7_small_model,
    lesson7_step_data,
    small_model,
    sub_group_parts,
    sync_bn_group_calls,
    sync_bn_inputs,
)

JOBS = {}  # no torchrun job: every check is a relayed job of its own (report below)
WORLDS = (2, 3)
_secrets: list[int] = []  # the ranks' secrets of the job being judged


@pytest.fixture(scope="module")
def ex():
    yield from graded(7)


def once(check):
    """A fail-fast check runs once per grading run; later calls repeat its outcome."""
    outcome = {}

    def run(ex):
        if "error" not in outcome:
            try:
                check(ex)
                outcome["error"] = None
            except Exception as error:
                outcome["error"] = error
        if outcome["error"] is not None:
            raise outcome["error"]
    return run


def report(world_size, name):
    """The report of verdict `name` on the relayed job of its check at `world_size` ranks
    (launched once, shared by the verdicts of that check), judged here."""
    verdicts = {
        **{name: ("bucketed", lambda seen, n=name: judge_bucketed(seen)[n])
           for name in ("bucketed_result", "bucketed_buckets", "bucketed_overlap")},
        **{name: ("sync_bn", lambda seen, n=name: judge_sync_bn(seen)[n])
           for name in ("sync_bn_forward", "sync_bn_backward", "sync_bn_running",
                        "sync_bn_traffic")},
        **{name: ("accumulate", lambda seen, n=name: judge_accumulate(seen)[n])
           for name in ("accumulate_result", "accumulate_allreduce", "accumulate_loss")}}
    return relayed_report("lesson7_checks.py", verdicts, name, world_size, secrets=_secrets,
                          summarise=summary)


# --- the job's judges ------------------------------------------------------------------------

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


def group_name(ranks) -> str:
    return f"the group of ranks {{{', '.join(map(str, ranks))}}}"


def group_of(rank, world):
    return next(part for part in sub_group_parts(world) if rank in part)


def outside_the_group(collectives, ranks) -> list[str]:
    """The collectives (op, values, bytes, group ranks, ...) the relay saw run on another
    group than `ranks`."""
    return sorted({f"{op} on ranks {list(on)}" for op, _, _, on, *_ in collectives
                   if list(on) != list(ranks)})


def ddp_gradients(frozen, group_ranks):
    """DDP's gradients at each step for a group: the mean over its ranks of each one's
    gradients on its own batch, all ranks holding the same parameters; SGD with momentum
    between steps. [per step: [per parameter: gradient or None]]."""
    model = layered_model()
    if frozen is not None:
        list(model.parameters())[frozen].requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    steps = []
    for step in range(STEPS):
        total = None
        for rank in group_ranks:
            model.zero_grad()
            x, y = lesson7_step_data(step, group_ranks, rank, _secrets[rank])
            F.cross_entropy(model(x), y).backward()
            grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
            total = grads if total is None else [
                None if a is None else a + b for a, b in zip(total, grads, strict=True)]
        mean = [None if g is None else g / len(group_ranks) for g in total]
        for p, g in zip(model.parameters(), mean, strict=True):
            p.grad = g
        steps.append(mean)
        optimizer.step()
    return steps


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


def bucket_problems(params, cap, where, ranks, collectives):
    """What is wrong with one step's collectives, as the relay saw them."""
    ops = {c[0] for c in collectives}
    if ops - {"allreduce"}:
        return [f"{where}: collectives other than all_reduce: {sorted(ops)}"]
    elsewhere = outside_the_group(collectives, ranks)
    if elsewhere:
        return [f"{where}: all-reduces outside {group_name(ranks)}, the group given: "
                f"{elsewhere}"]
    want = expected_buckets(params, cap)
    got = sorted(c[2] for c in collectives)
    if got == want:
        return []
    alone = {p.numel() * p.element_size() for p in params}  # over the cap: a bucket alone
    too_big = [n for n in got if n > cap and n not in alone]
    values = sorted(c[1] for c in collectives)
    return [f"{where}: {len(got)} all-reduces of {got} bytes ({values} values); the buckets "
            f"hold {want} bytes of float32 gradients ({len(params)} parameters)"
            + (f"; {too_big} bytes over the cap" if too_big else "")]


def overlap_problems(where, launches, waits, relayed_count):
    """launches: (phase, gradients still to come, async_op) of each all-reduce the rank
    started, as it noted them; relayed_count: the all-reduces the relay saw that step."""
    if not launches:
        return [f"{where}: no all-reduce was started"]
    if len(launches) != relayed_count:
        return [f"{where}: the rank noted {len(launches)} all-reduces started; the relay "
                f"carried {relayed_count}"]
    late = [launch for launch in launches if launch[0] != "backward"]
    if late:
        return [f"{where}: {len(late)} of {len(launches)} all-reduces started after backward "
                "(in finish), so none of the communication overlaps backward's computation"]
    blocking = [launch for launch in launches if launch[-1] is not True]
    if blocking:
        return [f"{where}: {len(blocking)} all-reduces were blocking (async_op=False): "
                "backward stood still while they ran"]
    waited = waits.count("backward")
    if waited:
        return [f"{where}: {waited} waits during backward (Work.wait or its future): the hooks "
                "waited for their all-reduce, so backward stood still while it ran (wait in "
                "finish)"]
    early = sum(1 for _, pending, _ in launches if pending > 0)
    if early < len(launches) - 1:
        return [f"{where}: only {early} of {len(launches)} all-reduces started while "
                "gradients were still to come: a bucket's all-reduce starts as soon as its "
                "last gradient arrives"]
    return []


@judge_once
def judge_bucketed(seen):
    """bucketed_result bucketed_buckets bucketed_overlap"""
    world = len(seen)
    everyone = list(range(world))
    verdicts = {"bucketed_result": [], "bucketed_buckets": [], "bucketed_overlap": []}
    notes = []
    references = {}
    for rank, cases in enumerate(seen):
        result, buckets, overlap, counts = [], [], [], []
        layout = [(cap, frozen, None, everyone) for cap, frozen in CONFIGS]
        layout.append((CONFIGS[0][0], None, "sub", group_of(rank, world)))
        if len(cases) != len(layout):
            raise ValueError("not every case was run")
        for (cap, frozen, group, ranks), steps in zip(layout, cases, strict=True):
            key = (frozen, tuple(ranks))
            if key not in references:
                references[key] = ddp_gradients(frozen, ranks)
            model = layered_model()
            if frozen is not None:
                list(model.parameters())[frozen].requires_grad_(False)
            params = [p for p in model.parameters() if p.requires_grad]
            names = [n for n, _ in model.named_parameters()]
            in_group = "" if group is None else f" (in {group_name(ranks)}: the mean over it)"
            for step, (observed, want) in enumerate(zip(steps, references[key], strict=True)):
                where = f"rank {rank}, cap {cap} bytes, step {step + 1}{in_group}"
                grads = observed["grads"]
                for name, got, ref in zip(names, grads, want, strict=True):
                    if ref is None:
                        continue
                    if not isinstance(got, torch.Tensor) or got.shape != ref.shape or \
                            not torch.allclose(got, ref, rtol=1e-5, atol=1e-6):
                        result.append(f"rank {rank}, cap {cap} bytes, step {step + 1}: the "
                                      f"gradient of {name} differs from DDP's{in_group}")
                        break
                relayed_reduces = [c for c in observed["collectives"] if c[0] == "allreduce"]
                buckets += bucket_problems(params, cap, where, ranks, observed["collectives"])
                overlap += overlap_problems(where, observed["launches"], observed["waits"],
                                            len(relayed_reduces))
                counts.append(len(relayed_reduces))
        if result:  # the mechanism counts only with the right gradients
            buckets = overlap = [f"rank {rank}: the gradients are wrong (see bucketed_result)"]
        verdicts["bucketed_result"] += result[:1]
        verdicts["bucketed_buckets"] += buckets[:1]
        verdicts["bucketed_overlap"] += overlap[:1]
        notes.append(f"all-reduces per step: {counts}")
    return {"bucketed_result": (verdicts["bucketed_result"], ""),
            "bucketed_buckets": (verdicts["bucketed_buckets"], notes[0]),
            "bucketed_overlap": (verdicts["bucketed_overlap"], "")}


# Per rank and pass: the statistics (2C + 1 values, float32 or float64; W times over for
# an all_gather, which counts what it receives), never the batch (far more in the first call).
BYTES_PER_RANK = 16 * (CHANNELS + 1)


def per_channel(values, like):
    return values.view(1, -1, *[1] * (like.dim() - 2))


def close(got, want, **tolerance):
    return isinstance(got, torch.Tensor) and got.shape == want.shape and \
        torch.allclose(got, want, **tolerance)


def sync_bn_call_problems(call, observed, rank, ranks, group_given, buffers, generator,
                          index):
    """The problems (forward, backward, traffic) of one call, against F.batch_norm in
    float64 on the group's batches together (built from every member's secret)."""
    _, _, momentum, eps = call
    x_all, dy_all, weight0, bias0, lo, hi = sync_bn_inputs(
        call, ranks, rank, generator, dict(enumerate(_secrets)), index)
    where = (f"rank {rank}, input {(hi - lo, *x_all.shape[1:])}, eps {eps:g}, "
             f"momentum {momentum:g}"
             + ("" if not group_given else f", in {group_name(ranks)}"))
    mean_ref, var_ref = buffers
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
    forward, backward, traffic = [], [], []
    y, want = observed["y"], y_ref[lo:hi].float()
    if not close(y, want, rtol=1e-4, atol=1e-4):
        worst = (y - want).abs().amax(dim=dims).tolist() if isinstance(y, torch.Tensor) and \
            y.shape == want.shape else ["?"]
        forward.append(f"{where}: the output differs from BatchNorm's on the group's batches "
                       f"by up to {[v if v == '?' else f'{v:.1e}' for v in worst]} in channels "
                       "0, 1 (variance near eps), 2 (constant)")
    for name, got, want in [("input", observed["x_grad"], x_ref.grad[lo:hi]),
                            ("weight", observed["w_grad"], w_share),
                            ("bias", observed["b_grad"], b_share)]:
        if not close(got, want.float(), rtol=1e-4, atol=1e-4):
            backward.append(f"{where}: the gradient of {name} is wrong" + (
                "" if name == "input" else " (this rank's share: the sum over its own "
                "values)"))
            break
    most = BYTES_PER_RANK * len(ranks)
    for part in ("forward", "backward"):
        collectives = observed[part]["collectives"]
        sent = sum(c[2] for c in collectives)
        elsewhere = outside_the_group(collectives, ranks)
        if elsewhere:
            traffic.append(f"{where}: the {part} ran collectives outside "
                           f"{group_name(ranks)}, the group given: {elsewhere}")
        elif sent > most:
            traffic.append(f"{where}: the {part} communicated {sent} bytes; the statistics of "
                           f"{CHANNELS} channels on {len(ranks)} ranks take at most {most} "
                           f"(this rank's input holds {(hi - lo) * x_all[0].numel() * 4})")
    return forward, backward, traffic


@judge_once
def judge_sync_bn(seen):
    """sync_bn_forward sync_bn_backward sync_bn_running sync_bn_traffic"""
    world = len(seen)
    found = {name: [] for name in ("sync_bn_forward", "sync_bn_backward", "sync_bn_running",
                                   "sync_bn_traffic")}
    for rank, runs in enumerate(seen):
        forward, backward, running, traffic = [], [], [], []
        mine = group_of(rank, world)
        index = 0  # the call's number among the check's: its data's salt
        for in_group, run in zip((False, True), runs, strict=True):
            ranks = mine if in_group else list(range(world))
            g = torch.Generator().manual_seed(11 + (ranks[0] if in_group else world))
            calls = sync_bn_group_calls(len(ranks)) if in_group else WORLD_SYNC_BN_CALLS(world)
            buffers = (torch.zeros(CHANNELS, dtype=torch.float64),
                       torch.ones(CHANNELS, dtype=torch.float64))
            for call, observed in zip(calls, run["calls"], strict=True):
                problems = sync_bn_call_problems(call, observed, rank, ranks, in_group,
                                                 buffers, g, index)
                index += 1
                for got, verdict_list in zip(problems, (forward, backward, traffic),
                                             strict=True):
                    verdict_list += got
            where = f"rank {rank}" + (f", in {group_name(ranks)}" if in_group else "")
            for name, want in [("running_mean", buffers[0]), ("running_var", buffers[1])]:
                got = run[name]
                if not close(got, want.float(), rtol=1e-5, atol=1e-5):
                    shown = [round(v, 5) for v in got.tolist()] if isinstance(
                        got, torch.Tensor) else got
                    running.append(f"{where}: {name} is {shown}, BatchNorm's "
                                   f"{[round(v, 5) for v in want.tolist()]}"
                                   + (" (the unbiased variance?)" if name == "running_var"
                                      else ""))
        if forward or backward:  # the mechanism counts only with the right numbers
            traffic = [f"rank {rank}: the output or the gradients are wrong (see "
                       "sync_bn_forward and sync_bn_backward)"]
        for name, problems in zip(found, (forward, backward, running, traffic), strict=True):
            found[name] += problems[:1]
    return {name: (problems, "") for name, problems in found.items()}


K, OPT_STEPS = 3, 2


def judge_mean_loss(model, batches) -> float:
    """The mean of the loss over the micro-batches, with the model as it is now."""
    with torch.no_grad():
        return sum(F.cross_entropy(model(x), y).item() for x, y in batches) / len(batches)


@judge_once
def judge_accumulate(seen):
    """accumulate_result accumulate_allreduce accumulate_loss"""
    world = len(seen)
    reference = lesson7_small_model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(OPT_STEPS):
        pairs = [pair for r in range(world)
                 for pair in lesson7_micro_batches(step, _secrets[r])]
        x, y = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
        ref_opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        ref_opt.step()
    ref = torch.cat([p.detach().flatten() for p in reference.parameters()])
    params = ref.numel()
    result, allreduce, losses, notes = [], [], [], []
    for rank, observed in enumerate(seen):
        per_step = [sum(c[1] for c in step["collectives"] if c[0] == "allreduce")
                    for step in observed["steps"]]
        mine_losses = []
        for step, done in enumerate(observed["steps"]):
            start = lesson7_small_model()
            start.load_state_dict(done["start"])
            want = judge_mean_loss(start, lesson7_micro_batches(step, _secrets[rank]))
            got = done["returned"]
            where = f"rank {rank}, step {step + 1}"
            if not isinstance(got, float):
                mine_losses.append(f"{where}: accumulation_step returned a "
                                   f"{type(got).__name__}, not a float")
            elif abs(got - want) > 1e-5 * max(1.0, abs(want)):
                mine_losses.append(f"{where}: accumulation_step returned {got:.6f}; this "
                                   f"rank's mean loss over its K micro-batches, before the "
                                   f"step, is {want:.6f}")
        mine = observed["parameters"]
        rank_result = []
        if not close(mine, ref, rtol=0, atol=float("inf")):
            rank_result.append(f"rank {rank}: the trained model has not the model's "
                               "parameters")
            diff = float("inf")
        else:
            diff = (mine - ref).abs().max().item()
            if not diff <= 1e-5:
                rank_result.append(f"rank {rank}: after {OPT_STEPS} steps of K={K} "
                                   f"micro-batches the parameters differ from one process on "
                                   f"the big batches by {diff:.2e}")
            first = seen[0]["parameters"]
            if not (isinstance(first, torch.Tensor) and first.shape == mine.shape
                    and torch.equal(first, mine)):
                rank_result.append(f"rank {rank}: the ranks ended with different parameters")
        notes.append((f"max difference {diff:.1e}", f"values all-reduced per step: {per_step}"))
        if rank_result:
            allreduce.append(f"rank {rank}: the result is wrong (see accumulate_result)")
        elif any(type(n) is not int or not params <= n < 2 * params for n in per_step):
            allreduce.append(f"rank {rank}: gradient values all-reduced per optimizer step: "
                             f"{per_step}; the {params} parameters once each is {params} "
                             f"(K={K} micro-batches: no_sync on all but the last)")
        result += rank_result
        losses += mine_losses[:1]
    return {"accumulate_result": (result, notes[0][0]),
            "accumulate_allreduce": (allreduce, notes[0][1]),
            "accumulate_loss": (losses, "")}


def assert_ok(world_size, name):
    line = verdict(report(world_size, name), name)
    assert line.startswith(f"{name}: ok on {world_size} ranks"), line


# --- l7_bucketed_allreduce ----------------------------------------------------------------

def rule(sizes, cap):
    """The grader's copy of the rule in bucket_assignment's docstring."""
    buckets, filled = [], 0
    for index in reversed(range(len(sizes))):
        if buckets and filled + sizes[index] <= cap:
            buckets[-1].append(index)
            filled += sizes[index]
        else:
            buckets.append([index])
            filled = sizes[index]
    return buckets


@pytest.mark.l7_bucketed_allreduce
@pytest.mark.points(2)
def test_bucket_assignment_fills_buckets_from_the_last_parameter(ex):
    assert ex.bucket_assignment([48, 16, 32, 8], 40) == [[3, 2], [1], [0]]
    assert ex.bucket_assignment([4, 4, 4], 1000) == [[2, 1, 0]]
    assert ex.bucket_assignment([4, 4, 4], 4) == [[2], [1], [0]]
    assert ex.bucket_assignment([4, 4, 4], 1) == [[2], [1], [0]]  # each over the cap alone
    assert ex.bucket_assignment([], 10) == []
    # filled from the first parameter the buckets would be [[0, 1], [2, 3], [4..7]]
    layers = [512, 64, 1024, 64, 768, 48, 192, 16]
    assert ex.bucket_assignment(layers, 1100) == [[7, 6, 5, 4, 3], [2, 1], [0]]
    g = torch.Generator().manual_seed(0)
    for cap in (1, 100, 333, 1000, 4096):
        sizes = (torch.randint(1, 400, (30,), generator=g) * 4).tolist()
        assert ex.bucket_assignment(sizes, cap) == rule(sizes, cap), cap
    for cap in (0, -5):
        with pytest.raises(ValueError):
            ex.bucket_assignment([4, 4], cap)


@once
def bucketed_in_one_process(ex):
    """Fail fast, before paying for a launch: in a world of one the averaged gradients are
    the gradients themselves."""
    with ex.world_of_one():
        steps = ex.probe("bucketed_in_one_process")
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    for step, (x, grads) in enumerate(steps):
        plain.zero_grad()
        plain(x).square().sum().backward()
        for g, q in zip(grads, plain.parameters(), strict=True):
            assert isinstance(g, torch.Tensor) and g.shape == q.grad.shape and \
                torch.allclose(g, q.grad), \
                f"step {step + 1}: in a world of one the gradients changed"


@pytest.mark.l7_bucketed_allreduce
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_bucketed_gradients_equal_ddps(ex, world_size):
    """Two SGD steps at two bucket caps, one with a frozen parameter, and in sub-groups
    ({0} and {1} of 2, {0, 2} and {1} of 3, at the same time): after finish() the gradients
    are DDP's in that group (the mean over the group, not over the world)."""
    bucketed_in_one_process(ex)
    assert_ok(world_size, "bucketed_result")


@pytest.mark.l7_bucketed_allreduce
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_one_all_reduce_per_bucket_each_within_the_cap(ex, world_size):
    """Every step: as many all-reduces as buckets, of exactly the buckets' sizes in BYTES,
    on the group given. One per parameter, buckets filled from the first parameter, or a
    bucket sent as float64 (the right values, twice the bytes) fail here."""
    bucketed_in_one_process(ex)
    assert_ok(world_size, "bucketed_buckets")


@pytest.mark.l7_bucketed_allreduce
@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 3])
def test_buckets_start_during_backward_and_are_waited_for_in_finish(ex, world_size):
    """The overlap: each all-reduce starts in backward (async_op=True), all but the last
    while gradients are still to come, and nothing waits for one until finish(). All
    started after backward, or waited for in the hook, fail here."""
    bucketed_in_one_process(ex)
    assert_ok(world_size, "bucketed_overlap")


# --- l7_sync_batchnorm --------------------------------------------------------------------

@once
def sync_bn_in_one_process(ex):
    """Fail fast: in a world of one it is plain batch norm."""
    x = torch.randn(6, 3, 2, 2) * 2 + 1
    weight, bias = torch.rand(3) + 0.5, torch.randn(3)
    with ex.world_of_one():
        got = ex.sync_batch_norm(x, None, None, weight, bias)
    assert isinstance(got, torch.Tensor) and got.shape == x.shape, "not a tensor of x's shape"
    want = F.batch_norm(x, None, None, weight, bias, training=True)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), \
        "in a world of one the output is not batch norm's"


@pytest.mark.l7_sync_batchnorm
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_sync_batch_norm_output_is_batchnorm_on_all_ranks_batches(ex, world_size):
    """Batches of different sizes per rank (one of a single sample), (N, C, H, W) and
    (N, C) in the world group, (N, C, L) in sub-groups ({0, 2} and {1} of 3), eps and
    momentum other than the defaults, a channel with a variance near eps and a constant one:
    each rank's rows of BatchNorm's output on its group's batches together. eps anywhere but
    inside the square root, or a world-wide all-reduce given a sub-group, fail here."""
    sync_bn_in_one_process(ex)
    assert_ok(world_size, "sync_bn_forward")


@pytest.mark.l7_sync_batchnorm
@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 3])
def test_sync_batch_norm_gradients(ex, world_size):
    """The input's gradient (each rank's rows of BatchNorm's), and each rank's own share of
    the weight's and bias's gradients, in the same calls. A backward without the variance
    term (x_hat * sum_gx / n), or with this rank's sums only, fails here."""
    sync_bn_in_one_process(ex)
    assert_ok(world_size, "sync_bn_backward")


@pytest.mark.l7_sync_batchnorm
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_sync_batch_norm_running_statistics(ex, world_size):
    """running_mean and running_var (the unbiased variance) as BatchNorm's after two calls
    in the world group (momentum 0.1, then 0.3) and one in a sub-group."""
    sync_bn_in_one_process(ex)
    assert_ok(world_size, "sync_bn_running")


@pytest.mark.l7_sync_batchnorm
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_sync_batch_norm_communicates_statistics_not_the_batch(ex, world_size):
    """Forward and backward each send O(channels) bytes, whatever the batch size, and only
    to the group given: an all_gather of the input gives the right numbers and fails here.
    Counts only with the right output and gradients."""
    sync_bn_in_one_process(ex)
    assert_ok(world_size, "sync_bn_traffic")


# --- l7_accumulate_no_sync ----------------------------------------------------------------

def mean_loss(model, micro_batches) -> float:
    """The mean of the micro-batches' losses, with the model as it is now."""
    with torch.no_grad():
        return sum(F.cross_entropy(model(x), y).item()
                   for x, y in micro_batches) / len(micro_batches)


def accumulate_in_one_process(ex, k, steps=2):
    """After `steps` accumulation steps of k micro-batches of 4 (in the submission's process,
    probes.py): the trained parameters, the reference trained here, per step the forwards'
    all-reduce decisions (made here, from what each forward saw), per step the batch sizes
    the model itself saw, and per step (the loss returned, the mean loss before the step,
    computed here)."""
    data = accumulation_data(k, steps)
    trained, starts, forwards, sizes, returned = ex.probe("accumulate_in_one_process", k,
                                                          steps)
    # As DDP decides at each forward: all-reduce after its backward outside no_sync (which
    # clears require_backward_grad_sync), with grad enabled.
    decisions = [[sync and grad_on for sync, grad_on in step] for step in forwards]
    model = small_model()
    model.load_state_dict(trained)
    losses = []
    for start, micro_batches, got in zip(starts, data, returned, strict=True):
        before = small_model()  # the parameters this step started from
        before.load_state_dict(start)
        losses.append((got, mean_loss(before, micro_batches)))
    reference = small_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for micro_batches in data:
        x = torch.cat([x for x, _ in micro_batches])
        y = torch.cat([y for _, y in micro_batches])
        optimizer.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        optimizer.step()
    return model, reference, decisions, sizes, losses


@once
def accumulate_fails_fast(ex):
    """Before paying for a launch: the code runs (a wrong result is the job's to find)."""
    accumulate_in_one_process(ex, 2, steps=1)


def assert_same(model, reference, k):
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), \
            f"K={k}: {name} differs from one step on the big batch"


@pytest.mark.l7_accumulate_no_sync
@pytest.mark.points(1)
def test_accumulation_equals_one_big_batch_in_one_process(ex):
    for k in (1, 3):
        model, reference, *_ = accumulate_in_one_process(ex, k)
        assert_same(model, reference, k)


@pytest.mark.l7_accumulate_no_sync
@pytest.mark.points(6)
def test_only_the_last_micro_batch_is_synchronised(ex):
    """Of the K forwards of a step, one per micro-batch, DDP would all-reduce after the last
    only: the others run inside no_sync() (the forward too: DDP decides there). K = 1: its
    one forward outside."""
    for k in (4, 1):
        model, reference, decisions, sizes, _ = accumulate_in_one_process(ex, k)
        assert_same(model, reference, k)
        assert sizes == [[4] * k] * len(sizes), \
            (f"K={k}: the batch sizes the model saw, per step: {sizes}; accumulation runs one "
             "forward and backward per micro-batch of 4, never the K micro-batches joined")
        for step, synced in enumerate(decisions):
            assert synced.count(True) == 1 and synced[-1], \
                (f"K={k}, step {step + 1}: the forwards that DDP would follow with an "
                 f"all-reduce: {synced} (True: outside no_sync); the last one only should be")


@pytest.mark.l7_accumulate_no_sync
@pytest.mark.points(1)
def test_accumulation_returns_this_ranks_mean_loss(ex):
    """The float returned: the mean of the K micro-batches' losses, computed with the
    parameters the step started from (not scaled by 1/K, not the last micro-batch's, not
    the mean over the ranks), in one process (K = 1 and 3) and on each rank of the jobs."""
    for k in (1, 3):
        for step, (got, want) in enumerate(accumulate_in_one_process(ex, k)[-1]):
            assert isinstance(got, float), \
                f"accumulation_step returned a {type(got).__name__}, not a float"
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6), \
                (f"K={k}, step {step + 1}: accumulation_step returned {got:.6f}; the mean "
                 f"loss of the K micro-batches, before the step, is {want:.6f}")
    for world_size in WORLDS:
        assert_ok(world_size, "accumulate_loss")


@pytest.mark.l7_accumulate_no_sync
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_accumulation_equals_one_big_batch_on_every_rank(ex, world_size):
    """Two steps of K=3 micro-batches per rank: the parameters of one process on every
    rank's micro-batches together, the same on every rank."""
    accumulate_fails_fast(ex)
    assert_ok(world_size, "accumulate_result")


@pytest.mark.l7_accumulate_no_sync
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_accumulation_all_reduces_once_per_optimizer_step(ex, world_size):
    """With the real DDP, the gradient values all-reduced per optimizer step: the
    parameters' worth once, not K times, not never."""
    accumulate_fails_fast(ex)
    assert_ok(world_size, "accumulate_allreduce")
