"""Grading tests for lesson 3. The sampler is graded against DistributedSampler itself, the
gradient averaging against DDP, and the DDP loop against one-process training and, for most
of its points, by its mechanism: which samples each rank read, and the all-reduces that
averaged the gradients (workers/lesson3_ddp.py watches both)."""

import itertools
import math

import pytest
import torch
from jobs import Job, graded, report_of, verdict
from torch.utils.data import DistributedSampler

# world size -> its job
JOBS = {w: Job(f"lesson3_W{w}", "lesson3_ddp.py", nproc=w) for w in (2, 3)}


@pytest.fixture(scope="module")
def ex():
    yield from graded(3)


# --- l3_batch_and_lr -----------------------------------------------------------------------

@pytest.mark.l3_batch_and_lr
@pytest.mark.points(2)
def test_per_process_batch(ex):
    assert ex.per_process_batch(256, 1) == 256
    assert ex.per_process_batch(256, 4) == 64
    assert ex.per_process_batch(255, 3) == 85
    assert ex.per_process_batch(7, 7) == 1
    for global_batch, world_size in [(256, 3), (100, 8), (2, 4), (0, 1), (8, 0), (-8, 2)]:
        with pytest.raises(ValueError):
            ex.per_process_batch(global_batch, world_size)


@pytest.mark.l3_batch_and_lr
@pytest.mark.points(1)
def test_effective_batch(ex):
    assert ex.effective_batch(64, 4) == 256
    assert ex.effective_batch(32, 4, accumulation_steps=2) == 256
    assert ex.effective_batch(16, 3, 4) == 192
    assert ex.effective_batch(1, 1, 1) == 1
    for args in [(0, 4, 1), (32, 0, 1), (32, 4, 0)]:
        with pytest.raises(ValueError):
            ex.effective_batch(*args)


@pytest.mark.l3_batch_and_lr
@pytest.mark.points(1)
def test_scaled_lr(ex):
    assert ex.scaled_lr(0.1, 256, 256) == pytest.approx(0.1)
    assert ex.scaled_lr(0.1, 256, 1024) == pytest.approx(0.4)
    assert ex.scaled_lr(0.1, 256, 64) == pytest.approx(0.025)
    assert ex.scaled_lr(3e-4, 512, 96) == pytest.approx(3e-4 * 96 / 512)
    # 8 processes x 64 samples x 2 accumulation steps: a global batch of 1024
    assert ex.scaled_lr(0.1, 256, ex.effective_batch(64, 8, 2)) == pytest.approx(0.4)
    for args in [(0.1, 0, 256), (0.1, 256, 0), (0.0, 256, 256), (-0.1, 256, 256)]:
        with pytest.raises(ValueError):
            ex.scaled_lr(*args)


# --- l3_sampler_indices --------------------------------------------------------------------

SAMPLER_ITER = DistributedSampler.__iter__


@pytest.fixture
def no_distributed_sampler(ex):
    """sampler_indices must work the indices out, not ask DistributedSampler for them."""
    with ex.options(refuse=[("torch.utils.data.distributed", "DistributedSampler.__iter__",
                             "sampler_indices asked DistributedSampler: work the indices "
                             "out yourself")]):
        yield


def real_sampler(length, world_size, rank, shuffle=True, seed=0, epoch=0, drop_last=False):
    sampler = DistributedSampler(range(length), num_replicas=world_size, rank=rank,
                                 shuffle=shuffle, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(SAMPLER_ITER(sampler))


def all_ranks(ex, length, world_size, **kw):
    return ([ex.sampler_indices(length, world_size, r, **kw) for r in range(world_size)],
            [real_sampler(length, world_size, r, **kw) for r in range(world_size)])


@pytest.mark.l3_sampler_indices
@pytest.mark.usefixtures("no_distributed_sampler")
@pytest.mark.points(1)
def test_sampler_in_order(ex):
    assert ex.sampler_indices(5, 2, 1, shuffle=False) == [1, 3, 0]
    for length, world_size in [(8, 4), (10, 3), (7, 2), (12, 5), (1, 1)]:
        mine, real = all_ranks(ex, length, world_size, shuffle=False)
        assert mine == real, (length, world_size)


@pytest.mark.l3_sampler_indices
@pytest.mark.usefixtures("no_distributed_sampler")
@pytest.mark.points(2)
def test_sampler_shuffles_by_seed_and_epoch(ex):
    for length, world_size, seed, epoch in [(20, 4, 0, 0), (20, 4, 0, 1), (20, 4, 7, 3),
                                            (1437, 4, 0, 5), (33, 3, 42, 2)]:
        mine, real = all_ranks(ex, length, world_size, seed=seed, epoch=epoch)
        assert mine == real, (length, world_size, seed, epoch)
    # the same (seed, epoch) on every rank: together the shares cover every index
    shares = [ex.sampler_indices(1437, 4, r, seed=3, epoch=2) for r in range(4)]
    assert set(itertools.chain(*shares)) == set(range(1437))
    assert [len(share) for share in shares] == [360] * 4  # 3 indices repeated as padding


@pytest.mark.l3_sampler_indices
@pytest.mark.usefixtures("no_distributed_sampler")
@pytest.mark.points(2)
def test_sampler_padding_and_drop_last_with_odd_world_sizes(ex):
    combos = itertools.product([0, 1, 2, 5, 7, 10, 11, 97, 360], [1, 2, 3, 4, 5, 7],
                               [False, True], [False, True])
    for length, world_size, shuffle, drop_last in combos:
        mine, real = all_ranks(ex, length, world_size, shuffle=shuffle, seed=1, epoch=1,
                               drop_last=drop_last)
        assert mine == real, (length, world_size, shuffle, drop_last)
        assert len({len(share) for share in mine}) == 1  # every rank the same count
    # 2 samples over 5 ranks: the order is repeated to give everyone one
    assert ex.sampler_indices(2, 5, 4, shuffle=False) == [0]
    assert ex.sampler_indices(11, 3, 2, shuffle=False, drop_last=True) == [2, 5, 8]


@pytest.mark.l3_sampler_indices
@pytest.mark.usefixtures("no_distributed_sampler")
@pytest.mark.points(1)
def test_sampler_rejects_impossible_ranks(ex):
    for length, world_size, rank in [(10, 4, 4), (10, 4, -1), (10, 0, 0), (-1, 2, 0)]:
        with pytest.raises(ValueError):
            ex.sampler_indices(length, world_size, rank)


# --- the two exercises that run in a real job --------------------------------------------

def job(world_size):
    return report_of(JOBS[world_size])


@pytest.mark.l3_average_gradients
@pytest.mark.points(4)
def test_average_gradients_matches_ddp_on_three_processes(ex):
    with ex.world_of_one():  # fail fast, before paying for a launch
        before, after = ex.probe("average_gradients_once", torch.randn(3, 12))
    assert len(after) == len(before) and all(
        isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b)
        for a, b in zip(after, before, strict=True))
    line = verdict(job(3), "average_gradients")
    assert line == "average_gradients: ok on 3 ranks", line


def train_ddp_once_in_process(ex):
    x, y = torch.randn(30, 12), torch.randint(0, 4, (30,))
    with ex.world_of_one():  # fail fast, before paying for a launch
        is_module, start, trained = ex.probe("train_ddp_once", x, y)
    assert is_module is True, "train_ddp must return the trained model"
    assert any(isinstance(p, torch.Tensor) and n in start and p.shape == start[n].shape
               and not torch.equal(p, start[n]) for n, p in trained.items())


@pytest.mark.l3_ddp_step
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_train_ddp_reproduces_one_process(ex, world_size):
    train_ddp_once_in_process(ex)
    line = verdict(job(world_size), "train_ddp")
    assert line.startswith(f"train_ddp: ok on {world_size} ranks"), line
    assert math.isfinite(float(line.rsplit(" ", 1)[-1]))


@pytest.mark.l3_ddp_step
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_train_ddp_each_rank_reads_only_its_share(ex, world_size):
    """Every epoch each rank reads its own DistributedSampler share (set_epoch), one
    per-process batch per step: disjoint shares that together make the global batches. A
    loop in which every rank reads the whole dataset (it can still reproduce one-process
    training) fails here."""
    train_ddp_once_in_process(ex)
    line = verdict(job(world_size), "train_ddp_data")
    assert line == f"train_ddp_data: ok on {world_size} ranks", line


@pytest.mark.l3_ddp_step
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_train_ddp_averages_gradients_every_step(ex, world_size):
    """The gradients are all-reduced during training: all the parameters' worth every step
    (DDP's hooks do it in backward), and not twice."""
    train_ddp_once_in_process(ex)
    line = verdict(job(world_size), "train_ddp_allreduce")
    assert line.startswith(f"train_ddp_allreduce: ok on {world_size} ranks"), line
