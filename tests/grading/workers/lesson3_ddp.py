"""Run under torchrun by the lesson 3 grading tests: checks the graded code in a real job.

average_gradients: each rank computes gradients on its own data with a plain model, averages
them with the graded function, and compares them with the gradients DDP computes from the
same data; then the same inside a group of ranks 0 and 1, with rank-dependent gradients.
train_ddp: every rank trains with the graded function; each compares the result with the
one-device loop below (the reference) and with the other ranks.

Every exercise is checked on its own, so one that fails does not cost the other. Rank 0
prints one line per exercise: `<name>: ok on W ranks ...` or `<name>: FAILED ...`.
"""

import copy
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import TensorDataset

import ddpcourse.runtime  # noqa: F401  before init_process_group: see the comment there
from ddpcourse.grading import load_exercises

TOLERANCE = 1e-5
ex = load_exercises(3)
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
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


def check_average_gradients():
    problems = []
    # 1. Against DDP: the same local data through a DDP model and through a plain one.
    x, y = data(10 + rank, seed=100 + rank)  # different data, even different sizes, per rank
    plain, wrapped = small_model(), DDP(small_model())
    F.cross_entropy(plain(x), y).backward()
    F.cross_entropy(wrapped(x), y).backward()
    ex.average_gradients(plain)
    for (name, p), q in zip(plain.named_parameters(), wrapped.module.parameters(), strict=True):
        if p.grad is None or not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7):
            problems.append(f"rank {rank}: gradient of {name} differs from DDP's")
    # 2. Frozen parameters keep grad None.
    frozen = small_model()
    frozen[0].weight.requires_grad_(False)
    F.cross_entropy(frozen(x), y).backward()
    ex.average_gradients(frozen)
    if frozen[0].weight.grad is not None:
        problems.append(f"rank {rank}: a frozen parameter's grad is no longer None")
    # 3. Inside a group of ranks 0 and 1 only: the mean over the group, not over the world.
    pair = dist.new_group([0, 1]) if world > 1 else None
    if world > 1 and rank in (0, 1):
        model = small_model()
        for p in model.parameters():
            p.grad = torch.full_like(p, float(rank + 1))
        ex.average_gradients(model, group=pair)
        if not all(torch.allclose(p.grad, torch.full_like(p, 1.5)) for p in model.parameters()):
            problems.append(f"rank {rank}: in the group of ranks 0 and 1 the gradients of 1 "
                            "and 2 did not average to 1.5")
    return problems, ""


def check_train_ddp():
    problems = []
    # 95 samples: not a multiple of 2 or 3, so the sampler pads; 7 global batches of 12.
    x, y = data(95, seed=7)
    dataset = TensorDataset(x, y)
    start = small_model(seed=3)
    trained = ex.train_ddp(copy.deepcopy(start), dataset, global_batch=12, epochs=2, lr=0.1,
                           seed=5)
    if isinstance(trained, DDP):
        problems.append(f"rank {rank}: train_ddp returned the DDP wrapper, not the model")
        trained = trained.module
    reference = one_device(copy.deepcopy(start), dataset, 12, epochs=2, lr=0.1, seed=5)
    mine = torch.cat([p.detach().flatten() for p in trained.parameters()])
    ref = torch.cat([p.detach().flatten() for p in reference.parameters()])
    diff = (mine - ref).abs().max().item()
    if diff > TOLERANCE:
        problems.append(f"rank {rank}: parameters differ from one-device training by "
                        f"{diff:.2e} (more than {TOLERANCE:g})")
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    if not all(torch.allclose(e, mine, rtol=0, atol=1e-7) for e in everyone):
        problems.append(f"rank {rank}: the ranks ended with different parameters")
    return problems, f"max difference {diff:.1e}"


verdicts = {}
for name, check in [("average_gradients", check_average_gradients),
                    ("train_ddp", check_train_ddp)]:
    try:
        problems, note = check()
    except Exception as error:  # the graded code raised: this exercise fails, the next runs
        problems, note = [f"rank {rank}: {type(error).__name__}: {error}"], ""
    gathered = [None] * world
    dist.all_gather_object(gathered, (problems, note))
    verdicts[name] = gathered

dist.destroy_process_group()
if rank == 0:
    for name, gathered in verdicts.items():
        problems = [p for per_rank, _ in gathered for p in per_rank]
        if problems:
            print(f"{name}: FAILED: " + "; ".join(problems[:4]))
        else:
            note = gathered[0][1]
            print(f"{name}: ok on {world} ranks" + (f", {note}" if note else ""))
sys.exit(0)
