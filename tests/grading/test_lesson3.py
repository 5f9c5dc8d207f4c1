"""Grading tests for lesson 3. The sampler is graded against DistributedSampler itself, the
gradient averaging against DDP, and the DDP loop against one-process training and, for most
of its points, by its mechanism: which samples each rank read (what the rank reports), and the
all-reduces that averaged the gradients (the relay's record). The checks that need several
ranks run at 2 and 3 ranks as relayed jobs, one per check (workers/lesson3_ddp.py: every rank
a sandbox of its own, the relay in this process the only road between them)."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler, TensorDataset

from ddpcourse.course.hidden import drawn
from ddpcourse.course.jobs import brief, difference, graded, relayed_report, verdict
from ddpcourse.course.probes import class_names, lesson3_data, lesson3_model

JOBS = {}  # no torchrun job: every check is a relayed job of its own (report below)
_secrets: list[int] = []  # the ranks' secrets of the job being judged


@pytest.fixture(scope="module")
def ex():
    yield from graded(3)


def ranks_difference(mine, real):
    """The first rank whose list differs from DistributedSampler's, and where."""
    rank = next((r for r, (m, w) in enumerate(zip(mine, real, strict=True)) if m != w), 0)
    return f"rank {rank}: {difference(mine[rank], real[rank])}"


def gradients(grads):
    """What each parameter's .grad was, in a few words (for a message)."""
    return [f"{tuple(g.shape)} tensor" if isinstance(g, torch.Tensor) else brief(g, 20)
            for g in grads] if isinstance(grads, list) else grads


# --- l3_batch_and_lr -----------------------------------------------------------------------

@pytest.mark.l3_batch_and_lr
@pytest.mark.points(2)
def test_per_process_batch(ex):
    got = ex.per_process_batch(256, 1)
    assert got == 256, f"per_process_batch(256, world_size=1) returned {got!r}, expected 256 (all)"
    got = ex.per_process_batch(256, 4)
    assert got == 64, f"per_process_batch(256, world_size=4) returned {got!r}, expected 256/4 = 64"
    got = ex.per_process_batch(255, 3)
    assert got == 85, f"per_process_batch(255, world_size=3) returned {got!r}, expected 255/3 = 85"
    got = ex.per_process_batch(7, 7)
    assert got == 1, f"per_process_batch(7, world_size=7) returned {got!r}, expected 7/7 = 1"
    for global_batch, world_size in [(256, 3), (100, 8), (2, 4), (0, 1), (8, 0), (-8, 2)]:
        with pytest.raises(ValueError):
            ex.per_process_batch(global_batch, world_size)


@pytest.mark.l3_batch_and_lr
@pytest.mark.points(1)
def test_effective_batch(ex):
    got = ex.effective_batch(64, 4)
    assert got == 256, f"effective_batch(64, world_size=4) returned {got!r}, expected 64 x 4 = 256"
    got = ex.effective_batch(32, 4, accumulation_steps=2)
    assert got == 256, (f"effective_batch(32, world_size=4, accumulation_steps=2) returned "
                        f"{got!r}, expected 32 x 4 x 2 = 256")
    got = ex.effective_batch(16, 3, 4)
    assert got == 192, (f"effective_batch(16, world_size=3, accumulation_steps=4) returned "
                        f"{got!r}, expected 16 x 3 x 4 = 192")
    got = ex.effective_batch(1, 1, 1)
    assert got == 1, (f"effective_batch(1, world_size=1, accumulation_steps=1) returned {got!r}, "
                      "expected 1")
    for args in [(0, 4, 1), (32, 0, 1), (32, 4, 0)]:
        with pytest.raises(ValueError):
            ex.effective_batch(*args)


@pytest.mark.l3_batch_and_lr
@pytest.mark.points(1)
def test_scaled_lr(ex):
    got = ex.scaled_lr(0.1, 256, 256)
    assert got == pytest.approx(0.1), (f"scaled_lr(0.1, base_batch=256, batch=256) returned "
                                       f"{got!r}, expected 0.1: the same batch, the same lr")
    got = ex.scaled_lr(0.1, 256, 1024)
    assert got == pytest.approx(0.4), (f"scaled_lr(0.1, base_batch=256, batch=1024) returned "
                                       f"{got!r}, expected 0.1 x 1024 / 256 = 0.4")
    got = ex.scaled_lr(0.1, 256, 64)
    assert got == pytest.approx(0.025), (f"scaled_lr(0.1, base_batch=256, batch=64) returned "
                                         f"{got!r}, expected 0.1 x 64 / 256 = 0.025")
    got = ex.scaled_lr(3e-4, 512, 96)
    assert got == pytest.approx(3e-4 * 96 / 512), (
        f"scaled_lr(3e-4, base_batch=512, batch=96) returned {got!r}, expected 3e-4 x 96 / 512 "
        f"= {3e-4 * 96 / 512:g}")
    # 8 processes x 64 samples x 2 accumulation steps: a global batch of 1024
    batch = ex.effective_batch(64, 8, 2)
    got = ex.scaled_lr(0.1, 256, batch)
    assert got == pytest.approx(0.4), (
        f"scaled_lr(0.1, base_batch=256, batch=effective_batch(64, 8, 2)) returned {got!r} "
        f"(effective_batch gave {batch!r}), expected 0.4: 64 x 8 x 2 = 1024 samples a step")
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
    got = ex.sampler_indices(5, 2, 1, shuffle=False)
    assert got == [1, 3, 0], (f"sampler_indices(5, world_size=2, rank=1, shuffle=False) returned "
                              f"{brief(got)}, expected [1, 3, 0]: positions 1, 3 of 0..4 and one "
                              "repeated from the start as padding")
    for length, world_size in [(8, 4), (10, 3), (7, 2), (12, 5), (1, 1)]:
        mine, real = all_ranks(ex, length, world_size, shuffle=False)
        assert mine == real, (f"sampler_indices({length}, world_size={world_size}, rank, "
                              f"shuffle=False) differs from DistributedSampler's share at "
                              f"{ranks_difference(mine, real)}")


@pytest.mark.l3_sampler_indices
@pytest.mark.usefixtures("no_distributed_sampler")
@pytest.mark.points(2)
def test_sampler_shuffles_by_seed_and_epoch(ex):
    """The cases below, and three drawn at grading time (hidden.py)."""
    hidden = drawn("sampler_shuffles")
    shown = [(20, 4, 0, 0), (20, 4, 0, 1), (20, 4, 7, 3), (1437, 4, 0, 5), (33, 3, 42, 2)]
    for length, world_size, seed, epoch in shown + [
            (hidden.randint(1, 300), hidden.randint(1, 7), hidden.randint(0, 10**6),
             hidden.randint(0, 20)) for _ in range(3)]:
        mine, real = all_ranks(ex, length, world_size, seed=seed, epoch=epoch)
        assert mine == real, (f"sampler_indices({length}, world_size={world_size}, rank, "
                              f"seed={seed}, epoch={epoch}) differs from DistributedSampler's "
                              f"share at {ranks_difference(mine, real)}")
    # the same (seed, epoch) on every rank: together the shares cover every index
    shares = [ex.sampler_indices(1437, 4, r, seed=3, epoch=2) for r in range(4)]
    covered = set(itertools.chain(*shares))
    assert covered == set(range(1437)), (
        f"sampler_indices(1437, world_size=4, rank, seed=3, epoch=2) for ranks 0..3 together "
        f"cover {len(covered & set(range(1437)))} of the indices 0..1436, expected all of them "
        f"(missed: {brief(sorted(set(range(1437)) - covered), 60)}, "
        f"others: {brief(sorted(covered - set(range(1437)), key=str), 60)})")
    sizes = [len(share) for share in shares]
    assert sizes == [360] * 4, (  # 3 indices repeated as padding
        f"sampler_indices(1437, world_size=4, rank, seed=3, epoch=2) gave ranks 0..3 {sizes} "
        "indices, expected 360 each: 1437 padded to 1440, 3 indices repeated")


@pytest.mark.l3_sampler_indices
@pytest.mark.usefixtures("no_distributed_sampler")
@pytest.mark.points(2)
def test_sampler_padding_and_drop_last_with_odd_world_sizes(ex):
    combos = itertools.product([0, 1, 2, 5, 7, 10, 11, 97, 360], [1, 2, 3, 4, 5, 7],
                               [False, True], [False, True])
    for length, world_size, shuffle, drop_last in combos:
        mine, real = all_ranks(ex, length, world_size, shuffle=shuffle, seed=1, epoch=1,
                               drop_last=drop_last)
        assert mine == real, (f"sampler_indices({length}, world_size={world_size}, rank, "
                              f"shuffle={shuffle}, seed=1, epoch=1, drop_last={drop_last}) "
                              f"differs from DistributedSampler's share at "
                              f"{ranks_difference(mine, real)}")
        sizes = [len(share) for share in mine]
        assert len(set(sizes)) == 1, (  # every rank the same count
            f"sampler_indices({length}, world_size={world_size}, rank, shuffle={shuffle}, "
            f"drop_last={drop_last}) gave the ranks {sizes} indices: every rank needs the same "
            "number")
    # 2 samples over 5 ranks: the order is repeated to give everyone one
    got = ex.sampler_indices(2, 5, 4, shuffle=False)
    assert got == [0], (f"sampler_indices(2, world_size=5, rank=4, shuffle=False) returned "
                        f"{brief(got)}, expected [0]: the order 0, 1 is repeated as padding "
                        "until every rank has one")
    got = ex.sampler_indices(11, 3, 2, shuffle=False, drop_last=True)
    assert got == [2, 5, 8], (f"sampler_indices(11, world_size=3, rank=2, shuffle=False, "
                              f"drop_last=True) returned {brief(got)}, expected [2, 5, 8]: "
                              "drop_last cuts 11 to 9, no padding")


@pytest.mark.l3_sampler_indices
@pytest.mark.usefixtures("no_distributed_sampler")
@pytest.mark.points(1)
def test_sampler_rejects_impossible_ranks(ex):
    for length, world_size, rank in [(10, 4, 4), (10, 4, -1), (10, 0, 0), (-1, 2, 0)]:
        with pytest.raises(ValueError):
            ex.sampler_indices(length, world_size, rank)


# --- the two exercises that run in a real job --------------------------------------------

def report(world_size, name):
    """The report of verdict `name` on the relayed job of its check at `world_size` ranks
    (launched once, shared by the verdicts of that check), judged here from what the ranks
    reported and the relay saw."""
    verdicts = {"average_gradients": ("average_gradients", judge_average_gradients),
                "train_ddp": ("train_ddp", judge_train_ddp),
                "train_ddp_data": ("train_ddp", judge_train_ddp_data),
                "train_ddp_allreduce": ("train_ddp", judge_train_ddp_allreduce)}
    return relayed_report("lesson3_ddp.py", verdicts, name, world_size, secrets=_secrets)


# --- the job's judges ------------------------------------------------------------------------

TOLERANCE = 1e-5
N, GLOBAL_BATCH, EPOCHS, SEED = 95, 12, 2, 5  # as workers/lesson3_ddp.py trains


def close(got, want, **tolerance):
    return isinstance(got, torch.Tensor) and got.shape == want.shape and \
        torch.allclose(got, want, **tolerance)


def judge_average_gradients(seen):
    """Against DDP: the mean over the ranks of each rank's gradients on its own data; a frozen
    parameter keeps None; in the group of ranks 0 and 1, gradients 1 and 2 average to 1.5."""
    world, problems = len(seen), []
    local = []
    for rank in range(world):
        x, y = lesson3_data(10 + rank, seed=_secrets[rank])
        model = lesson3_model()
        F.cross_entropy(model(x), y).backward()
        local.append([p.grad for p in model.parameters()])
    names = [n for n, _ in lesson3_model().named_parameters()]
    ddp = [sum(grads[i] for grads in local) / world for i in range(len(names))]
    for rank, observed in enumerate(seen):
        averaged = observed["averaged"]
        for i, name in enumerate(names):
            got = averaged[i] if isinstance(averaged, list) and i < len(averaged) else None
            if not close(got, ddp[i], rtol=1e-5, atol=1e-7):
                problems.append(f"rank {rank}: gradient of {name} differs from DDP's")
        if observed["frozen_grad_none"] is not True:
            problems.append(f"rank {rank}: a frozen parameter's grad is no longer None")
        if world > 1 and rank in (0, 1):
            pair = observed["in_pair"]
            if not isinstance(pair, list) or len(pair) != len(names) or not all(
                    close(g, torch.full_like(d, 1.5)) for g, d in zip(pair, ddp, strict=True)):
                problems.append(f"rank {rank}: in the group of ranks 0 and 1 the gradients of 1 "
                                f"and 2 did not average to 1.5 (the mean over the group, not the "
                                f"world of {world})")
    return problems, ""


def one_device(model, dataset, global_batch, epochs, lr, seed=0):
    """The reference: the loop written out in train_ddp's docstring."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(len(dataset), generator=g).tolist()
        for step in range(len(dataset) // global_batch):
            images, labels = dataset[order[step * global_batch:(step + 1) * global_batch]]
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model


def judge_train_ddp(seen):
    problems = []
    x, y = lesson3_data(N, seed=7)
    reference = one_device(lesson3_model(seed=3), TensorDataset(x, y), GLOBAL_BATCH, EPOCHS,
                           lr=0.1, seed=SEED)
    ref = torch.cat([p.detach().flatten() for p in reference.parameters()])
    diffs = []
    for rank, observed in enumerate(seen):
        if observed["returned_wrapper"] is not False:
            problems.append(f"rank {rank}: train_ddp returned the DDP wrapper, not the model")
        mine = observed["parameters"]
        if not isinstance(mine, torch.Tensor) or mine.shape != ref.shape:
            problems.append(f"rank {rank}: the trained model has not the model's parameters")
            continue
        diff = (mine - ref).abs().max().item()
        diffs.append(diff)
        if not diff <= TOLERANCE:
            problems.append(f"rank {rank}: parameters differ from one-device training by "
                            f"{diff:.2e} (more than {TOLERANCE:g})")
        if not close(mine, seen[0]["parameters"], rtol=0, atol=1e-7):
            problems.append(f"rank {rank}: the ranks ended with different parameters")
    return problems, f"max difference {max(diffs, default=float('nan')):.1e}"


def judge_train_ddp_data(seen):
    """Each rank must read, epoch after epoch, the first steps x per-rank-batch indices of
    its DistributedSampler share (shuffle=True, seed, set_epoch(epoch)), in order. A loop
    that stops after `steps` batches may have let the loader fetch one batch more: allowed."""
    world = len(seen)
    problems = []
    for rank, observed in enumerate(seen):
        read = observed["read"]
        if not isinstance(read, list) or not all(type(i) is int for i in read):
            problems.append(f"rank {rank}: the indices read are not a list of ints")
            continue
        problems += shares_problems(read, rank, world)
    return problems, ""


def shares_problems(read, rank, world):
    steps, batch = N // GLOBAL_BATCH, GLOBAL_BATCH // world
    need = steps * batch
    if not read:
        return [f"rank {rank} read no samples in its own process (the grader watches the "
                "dataset there: keep the DataLoader's num_workers=0)"]
    sampler = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=True,
                                 seed=SEED)
    shares = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        shares.append(list(SAMPLER_ITER(sampler)))
    at = 0
    for epoch, share in enumerate(shares):
        got = read[at:at + need]
        if got != share[:need]:
            return [f"rank {rank}, epoch {epoch}: read {describe(got)}; its share is "
                    f"{describe(share[:need])} ({steps} steps x {batch} samples of "
                    f"DistributedSampler(seed={SEED}) after set_epoch({epoch})). It read "
                    f"{len(read)} samples in {EPOCHS} epochs, its shares hold {EPOCHS * need}"]
        at += need
        following = shares[epoch + 1][:need] if epoch + 1 < EPOCHS else None
        if read[at:at + need] != following:  # not straight on to the next epoch
            ahead = share[need:need + batch]
            while ahead and read[at:at + len(ahead)] != ahead:
                ahead = ahead[:-1]
            at += len(ahead)
    if at != len(read):
        return [f"rank {rank} read {len(read)} samples in {EPOCHS} epochs; its shares of the "
                f"{EPOCHS * steps} steps hold {EPOCHS * need}"]
    return []


def describe(indices):
    head = ", ".join(map(str, indices[:5]))
    return f"{len(indices)} samples [{head}{', ...' if len(indices) > 5 else ''}]"


def judge_train_ddp_allreduce(seen):
    """DDP all-reduces every parameter's gradient once per step (in buckets): at least the
    parameters' numel per step, and less than twice that."""
    steps = EPOCHS * (N // GLOBAL_BATCH)
    params = sum(p.numel() for p in lesson3_model().parameters())
    low, high = steps * params, 2 * steps * params
    problems, notes = [], []
    for rank, observed in enumerate(seen):
        reduced = sum(c[1] for c in observed["collectives"] if c[0] == "allreduce")
        notes.append(f"{reduced / steps:g} values all-reduced per step")
        if reduced < low:
            problems.append(f"rank {rank}: {reduced} gradient values were all-reduced in "
                            f"{steps} steps; averaging all {params} gradients every step takes "
                            f"{low} (the DDP wrapper does it during backward)")
        elif reduced >= high:
            problems.append(f"rank {rank}: {reduced} values were all-reduced in {steps} steps, "
                            f"{reduced / low:.1f} times the {params} gradients per step: "
                            "averaged twice? (DDP already averages them)")
    return problems, notes[0] if notes else ""


@pytest.mark.l3_average_gradients
@pytest.mark.points(4)
def test_average_gradients_matches_ddp_on_three_processes(ex):
    with ex.world_of_one():  # fail fast, before paying for a launch
        before, after = ex.probe("average_gradients_once", torch.randn(3, 12))
    assert len(after) == len(before) and all(
        isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b)
        for a, b in zip(after, before, strict=True)), (
        f"average_gradients(model) in a world of one process did not leave the gradients of the "
        f"model's {len(before)} parameters as they were (after it: {brief(gradients(after))}); "
        "averaged over one rank, each gradient is its own mean")
    line = verdict(report(3, "average_gradients"), "average_gradients")
    assert line == "average_gradients: ok on 3 ranks", f"in a job of 3 processes, {line}"


def train_ddp_once_in_process(ex):
    x, y = torch.randn(30, 12), torch.randint(0, 4, (30,))
    # train_ddp graded on its own: the submission's per_process_batch is the grader's here, as
    # in the job (GRADED_WITH in workers/lesson3_ddp.py)
    with ex.options(replace={"per_process_batch": "lesson3_per_process_batch"}), \
            ex.world_of_one():  # fail fast, before paying for a launch
        classes, start, trained = ex.probe("train_ddp_once", x, y)
    assert class_names(torch.nn.Module)[0] in classes, (
        f"train_ddp must return the trained model (an nn.Module); in a world of one process it "
        f"returned a {brief(classes[0] if classes else None, 80)}")
    assert any(isinstance(p, torch.Tensor) and n in start and p.shape == start[n].shape
               and not torch.equal(p, start[n]) for n, p in trained.items()), (
        "train_ddp(model, 30 samples, global_batch=8, epochs=1, lr=0.1) in a world of one "
        "process returned a model none of whose parameters changed from the start: it did not "
        "train it" + ("" if sorted(trained) == sorted(start) else
                      f" (its state holds {brief(sorted(trained), 80)}, the model's "
                      f"{sorted(start)})"))


@pytest.mark.l3_ddp_step
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_train_ddp_reproduces_one_process(ex, world_size):
    train_ddp_once_in_process(ex)
    line = verdict(report(world_size, "train_ddp"), "train_ddp")
    assert line.startswith(f"train_ddp: ok on {world_size} ranks"), (
        f"in a job of {world_size} processes, against one-process training: {line}")
    assert math.isfinite(float(line.rsplit(" ", 1)[-1])), (
        f"in a job of {world_size} processes, the largest difference from one-process "
        f"training is not a finite number: {line}")


@pytest.mark.l3_ddp_step
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_train_ddp_each_rank_reads_only_its_share(ex, world_size):
    """Every epoch each rank reads its own DistributedSampler share (set_epoch), one
    per-process batch per step: disjoint shares that together make the global batches. A
    loop in which every rank reads the whole dataset (it can still reproduce one-process
    training) fails here."""
    train_ddp_once_in_process(ex)
    line = verdict(report(world_size, "train_ddp_data"), "train_ddp_data")
    assert line == f"train_ddp_data: ok on {world_size} ranks", (
        f"in a job of {world_size} processes, the samples each rank read: {line}")


@pytest.mark.l3_ddp_step
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_train_ddp_averages_gradients_every_step(ex, world_size):
    """The gradients are all-reduced during training: all the parameters' worth every step
    (DDP's hooks do it in backward), and not twice."""
    train_ddp_once_in_process(ex)
    line = verdict(report(world_size, "train_ddp_allreduce"),
                   "train_ddp_allreduce")
    assert line.startswith(f"train_ddp_allreduce: ok on {world_size} ranks"), (
        f"in a job of {world_size} processes, the gradients all-reduced: {line}")
