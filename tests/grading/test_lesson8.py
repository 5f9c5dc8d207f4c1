"""Grading tests for lesson 8. bytes_per_rank is called here against the ZeRO paper's figures,
the arithmetic of every strategy and the edge inputs its docstring names; Zero1Optimizer and
pipeline_step run in torchrun jobs of 2 and 3 processes (workers/lesson8_parallel.py), in the
world and in sub-groups whose group ranks are not global ranks, which compare their results
with one process and, for most of their points, watch their mechanism: the optimizer state
each rank keeps and the bytes step() communicates; the messages between the pipeline's
stages, and what it must refuse before it sends anything."""


import pytest
import torch
import torch.nn as nn
from jobs import Job, graded, report_of, verdict

# world size -> its job
JOBS = {w: Job(f"lesson8_W{w}", "lesson8_parallel.py", nproc=w) for w in (2, 3)}


@pytest.fixture(scope="module")
def ex():
    yield from graded(8)


REFUSED_ANSWERS = ("predict", "plan_table", "zero_owners", "zero_stage_bytes", "stage_table",
                   "bytes_per_parameter")


@pytest.fixture(autouse=True)
def ready_made_answers_refused(ex):
    """The course's own arithmetic (ddpcourse.sharding, behind the lesson's tables) and
    torch's ZeroRedundancyOptimizer raise while the graded code runs, under any name (in the
    submission's process)."""
    def why(what):
        return f"{what} is a ready-made answer: write this one yourself"

    import ddpcourse.sharding as sharding
    refused = [("torch.distributed.optim", "ZeroRedundancyOptimizer.__init__",
                why("ZeroRedundancyOptimizer"))]
    refused += [("ddpcourse.sharding", name, why(f"ddpcourse.sharding.{name}"))
                for name in REFUSED_ANSWERS if hasattr(sharding, name)]
    with ex.options(refuse=refused):
        yield


# --- l8_memory_calculator ------------------------------------------------------------------

GB = 10**9
TERMS = ("params", "grads", "optimizer")
SHARDED = {"ddp": set(), "zero1": {"optimizer"}, "zero2": {"optimizer", "grads"},
           "zero3": set(TERMS), "fsdp": set(TERMS)}


def held(ex, *args, **kwargs):
    result = ex.bytes_per_rank(*args, **kwargs)
    assert set(result) == {*TERMS, "total"}, result
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in result.values()), result
    assert result["total"] == sum(result[t] for t in TERMS), result
    return result


@pytest.mark.l8_memory_calculator
@pytest.mark.points(2)
def test_the_zero_papers_example(ex):
    """The ZeRO paper's Figure 1: 7.5 B parameters, Adam in mixed precision, 64 GPUs:
    120 GB per GPU with plain data parallelism, 31.4 with stage 1, 16.6 with stage 2, 1.9
    with stage 3."""
    n = 7_500_000_000
    totals = {s: held(ex, n, 64, s, "adam", mixed_precision=True)["total"]
              for s in ("ddp", "zero1", "zero2", "zero3")}
    assert totals == {"ddp": 120 * GB, "zero1": 31_406_250_000, "zero2": 16_640_625_000,
                      "zero3": 1_875_000_000}, totals


@pytest.mark.l8_memory_calculator
@pytest.mark.points(2)
def test_seven_billion_parameters_on_eight_gpus(ex):
    n, w = 7 * GB, 8
    mixed = {"ddp": (14, 14, 84), "zero1": (14, 14, 10.5), "zero2": (14, 1.75, 10.5),
             "zero3": (1.75, 1.75, 10.5), "fsdp": (1.75, 1.75, 10.5)}
    fp32 = {"ddp": (28, 28, 56), "zero1": (28, 28, 7), "zero2": (28, 3.5, 7),
            "zero3": (3.5, 3.5, 7), "fsdp": (3.5, 3.5, 7)}
    for mixed_precision, table in ((True, mixed), (False, fp32)):
        for strategy, gigabytes in table.items():
            result = held(ex, n, w, strategy, "adam", mixed_precision=mixed_precision)
            got = tuple(result[t] / GB for t in TERMS)
            assert got == gigabytes, (strategy, mixed_precision, got, gigabytes)
    assert held(ex, n, w, "ddp", mixed_precision=True)["total"] == 112 * GB
    assert held(ex, n, w, "zero3", mixed_precision=True)["total"] == 14 * GB


@pytest.mark.l8_memory_calculator
@pytest.mark.points(1)
def test_each_optimizer_keeps_its_own_state(ex):
    """SGD keeps nothing, momentum one fp32 buffer, Adam two; mixed precision adds the fp32
    master weights to the optimizer's term and halves the weights and gradients."""
    n = 1000
    for optimizer, buffers in (("sgd", 0), ("sgd_momentum", 1), ("adam", 2)):
        assert held(ex, n, 1, "ddp", optimizer) == {
            "params": 4000, "grads": 4000, "optimizer": 4000 * buffers,
            "total": 8000 + 4000 * buffers}, optimizer
        assert held(ex, n, 1, "ddp", optimizer, mixed_precision=True) == {
            "params": 2000, "grads": 2000, "optimizer": 4000 + 4000 * buffers,
            "total": 8000 + 4000 * buffers}, optimizer
    assert held(ex, n, 4, "zero1", "sgd")["optimizer"] == 0
    assert held(ex, n, 4, "zero1", "sgd", mixed_precision=True)["optimizer"] == 1000


@pytest.mark.l8_memory_calculator
@pytest.mark.points(2)
def test_each_strategy_shards_its_own_terms(ex):
    """From 1 to W ranks, the terms a strategy shards shrink W times and the others stay;
    at W = 1 every strategy is DDP; fsdp is zero3."""
    n = 2 * 3 * 4 * 5 * 7 * 1000
    for optimizer in ("sgd_momentum", "adam"):
        for mixed_precision in (False, True):
            alone = held(ex, n, 1, "ddp", optimizer, mixed_precision=mixed_precision)
            for strategy, sharded in SHARDED.items():
                assert held(ex, n, 1, strategy, optimizer,
                            mixed_precision=mixed_precision) == alone, strategy
                for w in (2, 3, 4, 5, 7):
                    got = held(ex, n, w, strategy, optimizer, mixed_precision=mixed_precision)
                    for term in TERMS:
                        want = alone[term] // w if term in sharded else alone[term]
                        assert got[term] == want, (strategy, optimizer, mixed_precision, w,
                                                   term, got[term], want)
    assert held(ex, n, 6, "fsdp") == held(ex, n, 6, "zero3")


@pytest.mark.l8_memory_calculator
@pytest.mark.points(1)
def test_a_shard_rounds_up(ex):
    """N parameters over W ranks: ceil(N / W) on every rank, the padding included; more ranks
    than parameters hold one each; one parameter on one rank is a model."""
    assert held(ex, 10, 4, "zero3", "sgd") == {"params": 12, "grads": 12, "optimizer": 0,
                                               "total": 24}
    assert held(ex, 3, 8, "zero2", "adam") == {"params": 12, "grads": 4, "optimizer": 8,
                                               "total": 24}
    assert held(ex, 1, 1, "fsdp", "sgd_momentum", mixed_precision=True) == {
        "params": 2, "grads": 2, "optimizer": 8, "total": 12}
    assert held(ex, 7, 8, "zero3", "adam", mixed_precision=True)["total"] == 16
    assert held(ex, 1_000_003, 3, "zero1", "adam") == {
        "params": 4_000_012, "grads": 4_000_012, "optimizer": 8 * 333_335,
        "total": 8_000_024 + 8 * 333_335}
    assert held(ex, 1001, 2, "zero2", "sgd_momentum", mixed_precision=True) == {
        "params": 2002, "grads": 2 * 501, "optimizer": 8 * 501, "total": 2002 + 10 * 501}


@pytest.mark.l8_memory_calculator
@pytest.mark.points(1)
def test_bad_input_is_refused(ex):
    for args, kwargs in [((0, 4, "ddp"), {}), ((-10, 4, "zero1"), {}), ((100, 0, "zero2"), {}),
                         ((100, -2, "zero3"), {}), ((100, 4, "zero4"), {}),
                         ((100, 4, "DDP-ish"), {}), ((100, 4, "fsdp"), {"optimizer": "lamb"}),
                         ((100, 4, "ddp"), {"optimizer": "Adam "})]:
        with pytest.raises(ValueError) as refused:
            ex.bytes_per_rank(*args, **kwargs)
        assert "\n" not in str(refused.value).strip(), (args, kwargs, str(refused.value))


# --- the two exercises that run in a real job --------------------------------------------

def job(world_size):
    return report_of(JOBS[world_size])


def assert_ok(world_size, name):
    line = verdict(job(world_size), name)
    assert line.startswith(f"{name}: ok on {world_size} ranks"), line


def first_call(ex, exercise):
    """Before a job is launched for it, the exercise is called once in a world of one (once
    per grading run): an unfinished one fails here, in a second, not after a launch."""
    if exercise not in _first_calls:
        try:
            with ex.world_of_one():
                if exercise == "zero1":
                    ex.probe("zero1_first_call")
                else:  # it must refuse a world of one; code that does not is stopped at its
                    # stage, before it waits for a second rank that is not there
                    ex.probe("pipeline_in_a_world_of_one", (2, 2), 2, (1, 2))
            _first_calls[exercise] = None
        except NotImplementedError as error:
            _first_calls[exercise] = f"not written yet: {error}"
        except Exception:  # a pipeline in a world of one must refuse: graded on its own
            _first_calls[exercise] = None
    if _first_calls[exercise]:
        pytest.fail(_first_calls[exercise])


_first_calls: dict[str, str | None] = {}


# --- l8_zero1_optimizer --------------------------------------------------------------------

@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(1)
def test_zero1_in_a_world_of_one_is_the_plain_optimizer(ex):
    """In a world of one, Zero1Optimizer is the optimizer it wraps: one rank owns all."""
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    with ex.world_of_one():
        seen = ex.probe("zero1_in_a_world_of_one", x, y)
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    plain = torch.optim.Adam(reference.parameters(), lr=0.05)
    for _ in range(2):
        nn.functional.cross_entropy(reference(x), y).backward()
        plain.step()
        plain.zero_grad()
    assert seen["grads_none"] is True
    assert seen["owners"] == [0, 0, 0, 0]
    assert all(isinstance(g, torch.Tensor) and not g.any() for g in seen["grads_after"]), \
        "zero_grad(set_to_none=False) must leave zeros, not None"
    assert len(seen["params"]) == 4
    for p, q in zip(seen["params"], reference.parameters(), strict=True):
        assert isinstance(p, torch.Tensor) and p.shape == q.shape and \
            torch.allclose(p, q, atol=1e-6)


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero1_trains_like_the_plain_optimizer(ex, world_size):
    """SGD with momentum and Adam, 3 steps of a DDP model: every rank's parameters equal
    the plain optimizer's on the whole batch."""
    first_call(ex, "zero1")
    assert_ok(world_size, "zero1")


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero1_each_rank_keeps_only_its_shards_state(ex, world_size):
    """Every parameter has one owner; each rank made one optimizer, over exactly the
    parameters it owns; summed over the ranks the state is the full state, kept once."""
    first_call(ex, "zero1")
    assert_ok(world_size, "zero1_state")


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero1_step_shares_the_parameters_by_broadcast(ex, world_size):
    """step() communicates by broadcast or all_gather only, exactly the parameters' bytes
    per step (all_gather: padded to the fullest shard, no more): no all_reduce, no barrier,
    no messages, no second copy; and the parameters it shares are the right ones."""
    first_call(ex, "zero1")
    assert_ok(world_size, "zero1_gather")
    assert_ok(world_size, "zero1")


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero1_in_a_sub_group_ranks_are_group_ranks(ex, world_size):
    """In the group of global rank 1 alone (W = 2) and of global ranks 1 and 2 (W = 3):
    the parameters end right, owners are group ranks, each rank steps the shard of its
    group rank, and step() shares exactly the parameters' bytes within the group."""
    first_call(ex, "zero1")
    assert_ok(world_size, "zero1_group")


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(1)
def test_zero1_a_rank_may_own_no_parameter(ex):
    """More ranks than parameters (one at W = 2, two at W = 3): the rank that owns none
    makes no optimizer, and every rank still ends with the right parameters."""
    first_call(ex, "zero1")
    assert_ok(2, "zero1_idle")
    assert_ok(3, "zero1_idle")


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(1)
def test_zero1_balances_the_shards_by_size(ex):
    """At 2 and 3 ranks, no rank holds more elements than the largest-first rule gives."""
    first_call(ex, "zero1")
    assert_ok(2, "zero1_balance")
    assert_ok(3, "zero1_balance")


# --- l8_pipeline_step ----------------------------------------------------------------------

@pytest.mark.l8_pipeline_step
@pytest.mark.points(1)
def test_pipeline_refuses_a_group_that_is_not_two_ranks(ex):
    """A world of one (here), a group of one and the world of three (in the jobs): a
    one-line ValueError, before the stage runs or any message is tried."""
    with ex.world_of_one(), pytest.raises(ValueError) as refused:
        ex.probe("pipeline_in_a_world_of_one", (4, 2), 2, (2, 2))
    assert "\n" not in str(refused.value).strip(), str(refused.value)
    first_call(ex, "pipeline")
    assert_ok(2, "pipeline_group_refused")
    assert_ok(3, "pipeline_group_refused")


@pytest.mark.l8_pipeline_step
@pytest.mark.points(1)
def test_pipeline_refuses_micro_batches_that_do_not_split_the_batch(ex):
    """A batch of 10 in 3 micro-batches, and 0 micro-batches, in the world of two and in
    the group of global ranks 1 and 2: a one-line ValueError on both stages, before either
    runs its stage or tries a message."""
    first_call(ex, "pipeline")
    assert_ok(2, "pipeline_split_refused")
    assert_ok(3, "pipeline_split_refused")


@pytest.mark.l8_pipeline_step
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_pipeline_gradients_equal_the_unsplit_models(ex, world_size):
    """3 and 4 micro-batches, onto gradients already there; at W = 3 in the group of global
    ranks 1 and 2. Stage 1 returns the whole batch's loss."""
    first_call(ex, "pipeline")
    assert_ok(world_size, "pipeline")


@pytest.mark.l8_pipeline_step
@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 3])
def test_pipeline_sends_one_message_per_micro_batch_each_way(ex, world_size):
    """M activations forward, M gradients back, each one micro-batch's size, only between
    the two stages; no collective; and the gradients come out right."""
    first_call(ex, "pipeline")
    assert_ok(world_size, "pipeline_messages")
    assert_ok(world_size, "pipeline")


@pytest.mark.l8_pipeline_step
@pytest.mark.points(6)
@pytest.mark.parametrize("world_size", [2, 3])
def test_pipeline_runs_all_forwards_before_the_backwards(ex, world_size):
    """GPipe: every micro-batch's activation crosses before the first gradient does (and the
    gradients come out right)."""
    first_call(ex, "pipeline")
    assert_ok(world_size, "pipeline_schedule")
    assert_ok(world_size, "pipeline")
