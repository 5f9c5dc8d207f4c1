"""Grading tests for lesson 7. bucket_assignment is checked against the rule in its
docstring; BucketedAllReduce against DDP and, for most of its points, by its mechanism: one
all-reduce per bucket, of the bucket's bytes, on the group given, started in backward as the
bucket fills and not waited for there; sync_batch_norm against BatchNorm on every rank's
batch together (with channels where the place of eps shows), and by what it communicates
(the statistics, never the batch, only within the group given); accumulation_step against
one process on the big batch, by which forwards run outside no_sync (a stand-in for DDP, in
this process), by the gradient values the real DDP all-reduces per optimizer step, and by
the loss it returns. The checks that need several ranks run in one torchrun job per world
size (workers/lesson7_checks.py), in the world group and in sub-groups of it."""


import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from jobs import Job, graded, report_of, verdict
from probes import accumulation_data, small_model

# world size -> its job
JOBS = {w: Job(f"lesson7_W{w}", "lesson7_checks.py", nproc=w) for w in (2, 3)}


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


def job(world_size):
    return report_of(JOBS[world_size])


def assert_ok(world_size, name):
    line = verdict(job(world_size), name)
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
    all-reduce decisions, per step the batch sizes the model itself saw, and per step (the
    loss returned, the mean loss before the step, computed here)."""
    data = accumulation_data(k, steps)
    trained, starts, decisions, sizes, returned = ex.probe("accumulate_in_one_process", k,
                                                           steps)
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
    for world_size in JOBS:
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
