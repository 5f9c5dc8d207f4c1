"""Run under torchrun by the lesson 3 grading tests: checks the graded code in a real job.

average_gradients: each rank computes gradients on its own data with a plain model, averages
them with the graded function, and compares them with the gradients DDP computes from the
same data; then the same inside a group of ranks 0 and 1, with rank-dependent gradients.

train_ddp: every rank trains with the graded function on a dataset that notes which samples
this process reads, while every collective the rank starts is recorded (traffic.py).
Three verdicts come of that one run:
  train_ddp            the result equals the one-device loop below, on every rank;
  train_ddp_data       each rank read exactly its DistributedSampler share of every epoch's
                       steps: disjoint shares that together make the global batches;
  train_ddp_allreduce  the gradients were all-reduced every step: all the parameters' worth
                       of elements per step, once.

Each check runs in a process group of its own (common.py). Rank 0 prints one line per
verdict: `<name>: ok on W ranks ...` or `<name>: FAILED: ...`. --submissions A,B,...
grades several submission folders, one block after `### submission A` each.
"""

import copy
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
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset, DistributedSampler
from traffic import Traffic

import ddpcourse.runtime  # noqa: F401  before init_process_group: see the comment there

TOLERANCE = 1e-5
GROUP_TIMEOUT = timedelta(seconds=30)
torch.set_num_threads(1)


def small_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g), torch.randint(0, 4, (n,), generator=g)


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


class WatchedDataset(Dataset):
    """A TensorDataset of (x, y) that notes, in order, every index this process reads: one
    at a time (as a DataLoader does) or many at once (dataset[list_of_indices])."""

    def __init__(self, x, y):
        self.x, self.y = x, y
        self.read: list[int] = []

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        if isinstance(index, slice):
            index = list(range(len(self)))[index]
        elif isinstance(index, tuple):
            index = list(index)
        self.read.extend(torch.as_tensor(index).flatten().tolist())
        return self.x[index], self.y[index]


# --- l3_average_gradients ------------------------------------------------------------------

def check_average_gradients(ex):
    problems = []
    # 1. Against DDP: the same local data through a DDP model and through a plain one.
    x, y = data(10 + RANK, seed=100 + RANK)  # different data, even different sizes, per rank
    plain, wrapped = small_model(), DDP(small_model())
    F.cross_entropy(plain(x), y).backward()
    F.cross_entropy(wrapped(x), y).backward()
    ex.average_gradients(plain)
    for (name, p), q in zip(plain.named_parameters(), wrapped.module.parameters(), strict=True):
        if p.grad is None or not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7):
            problems.append(f"rank {RANK}: gradient of {name} differs from DDP's")
    # 2. Frozen parameters keep grad None.
    frozen = small_model()
    frozen[0].weight.requires_grad_(False)
    F.cross_entropy(frozen(x), y).backward()
    ex.average_gradients(frozen)
    if frozen[0].weight.grad is not None:
        problems.append(f"rank {RANK}: a frozen parameter's grad is no longer None")
    # 3. Inside a group of ranks 0 and 1 only: the mean over the group, not over the world.
    pair = dist.new_group([0, 1]) if WORLD > 1 else None
    if WORLD > 1 and RANK in (0, 1):
        model = small_model()
        for p in model.parameters():
            p.grad = torch.full_like(p, float(RANK + 1))
        ex.average_gradients(model, group=pair)
        if not all(torch.allclose(p.grad, torch.full_like(p, 1.5)) for p in model.parameters()):
            problems.append(f"rank {RANK}: in the group of ranks 0 and 1 the gradients of 1 "
                            f"and 2 did not average to 1.5 (the mean over the group, not the "
                            f"world of {WORLD})")
    return {"average_gradients": (problems, "")}


# --- l3_ddp_step ---------------------------------------------------------------------------

N, GLOBAL_BATCH, EPOCHS, SEED = 95, 12, 2, 5  # 95: the sampler pads at W = 2 and W = 3


def check_train_ddp(ex):
    x, y = data(N, seed=7)
    watched = WatchedDataset(x, y)
    start = small_model(seed=3)
    with Traffic() as seen:
        trained = ex.train_ddp(copy.deepcopy(start), watched, global_batch=GLOBAL_BATCH,
                               epochs=EPOCHS, lr=0.1, seed=SEED)
    result = result_problems(trained, start, x, y)
    return {"train_ddp": result,
            "train_ddp_data": (data_problems(watched.read), ""),
            "train_ddp_allreduce": allreduce_problems(seen, start)}


def result_problems(trained, start, x, y):
    problems = []
    if isinstance(trained, DDP):
        problems.append(f"rank {RANK}: train_ddp returned the DDP wrapper, not the model")
        trained = trained.module
    reference = one_device(copy.deepcopy(start), torch.utils.data.TensorDataset(x, y),
                           GLOBAL_BATCH, EPOCHS, lr=0.1, seed=SEED)
    mine = torch.cat([p.detach().flatten() for p in trained.parameters()])
    ref = torch.cat([p.detach().flatten() for p in reference.parameters()])
    diff = (mine - ref).abs().max().item()
    if diff > TOLERANCE:
        problems.append(f"rank {RANK}: parameters differ from one-device training by "
                        f"{diff:.2e} (more than {TOLERANCE:g})")
    everyone = [torch.empty_like(mine) for _ in range(WORLD)]
    dist.all_gather(everyone, mine)
    if not all(torch.allclose(e, mine, rtol=0, atol=1e-7) for e in everyone):
        problems.append(f"rank {RANK}: the ranks ended with different parameters")
    return problems, f"max difference {diff:.1e}"


def data_problems(read):
    """This rank must read, epoch after epoch, the first steps x per-rank-batch indices of
    its DistributedSampler share (shuffle=True, seed, set_epoch(epoch)), in order. A loop
    that stops after `steps` batches may have let the loader fetch one batch more: allowed."""
    steps, batch = N // GLOBAL_BATCH, GLOBAL_BATCH // WORLD
    need = steps * batch
    if not read:
        return [f"rank {RANK} read no samples in its own process (the grader watches the "
                "dataset there: keep the DataLoader's num_workers=0)"]
    sampler = DistributedSampler(range(N), num_replicas=WORLD, rank=RANK, shuffle=True,
                                 seed=SEED)
    shares = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        shares.append(list(sampler))
    at = 0
    for epoch, share in enumerate(shares):
        got = read[at:at + need]
        if got != share[:need]:
            return [f"rank {RANK}, epoch {epoch}: read {describe(got)}; its share is "
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
        return [f"rank {RANK} read {len(read)} samples in {EPOCHS} epochs; its shares of the "
                f"{EPOCHS * steps} steps hold {EPOCHS * need}"]
    return []


def describe(indices):
    head = ", ".join(map(str, indices[:5]))
    return f"{len(indices)} samples [{head}{', ...' if len(indices) > 5 else ''}]"


def allreduce_problems(seen, model):
    """DDP all-reduces every parameter's gradient once per step (in buckets): at least the
    parameters' numel per step, and less than twice that."""
    steps = EPOCHS * (N // GLOBAL_BATCH)
    params = sum(p.numel() for p in model.parameters())
    reduced = sum(c.numel for c in seen.collectives
                  if "allreduce" in c.op or "all_reduce" in c.op)
    low, high = steps * params, 2 * steps * params
    note = f"{reduced / steps:g} values all-reduced per step"
    if reduced < low:
        return [f"rank {RANK}: {reduced} gradient values were all-reduced in {steps} steps; "
                f"averaging all {params} gradients every step takes {low} (the DDP wrapper "
                "does it during backward)"], note
    if reduced >= high:
        return [f"rank {RANK}: {reduced} values were all-reduced in {steps} steps, "
                f"{reduced / low:.1f} times the {params} gradients per step: averaged twice? "
                "(DDP already averages them)"], note
    return [], note


CHECKS = {"average_gradients": check_average_gradients, "train_ddp": check_train_ddp}
VERDICTS = {"average_gradients": ["average_gradients"],
            "train_ddp": ["train_ddp", "train_ddp_data", "train_ddp_allreduce"]}


if __name__ == "__main__":
    grade_each_submission(
        lambda store, tag: run_checks(store, tag, 3, CHECKS, VERDICTS, GROUP_TIMEOUT),
        "lesson 3 grading checks")
