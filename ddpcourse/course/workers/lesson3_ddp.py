"""Run by the lesson 3 grading tests as the ranks of a relayed job (W = 2 and 3): one check
per job, each rank in a sandbox of its own whose only road to the others is the relay
(ddpcourse/course/relay.py); tests/grading/test_lesson3.py judges it.

average_gradients: each rank computes gradients on its own data (from the secret the relay
gave it alone) with a plain model and averages them with the graded function (the judge
compares them with DDP's: the mean of every rank's); a frozen parameter; then inside a group
of ranks 0 and 1, with rank-dependent gradients.

train_ddp: every rank trains with the graded function on a dataset that notes which samples
this process reads (inside the rank: what it reads of its own memory no one else sees). It
reports the trained parameters and the indices read; the values all-reduced are the relay's
record. The judge compares them with one-device training, DistributedSampler's shares and
the parameter count.

    python ddpcourse/course/workers/lesson3_ddp.py --check train_ddp   (as a relayed rank)
"""

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset

from ddpcourse.course.probes import lesson3_data as data
from ddpcourse.course.probes import lesson3_model as small_model
from ddpcourse.course.workers import common
from ddpcourse.course.workers.common import RANK, WORLD, case, relayed_rank

GROUP_TIMEOUT = timedelta(seconds=30)
torch.set_num_threads(1)


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

def observe_average_gradients(ex):
    # 1. This rank's own data (different data, even different sizes, per rank) through a
    # plain model: the judge computes DDP's answer, the mean of every rank's gradients.
    x, y = data(10 + RANK, seed=common.SECRET)
    plain = small_model()
    F.cross_entropy(plain(x), y).backward()
    ex.average_gradients(plain)
    averaged = [p.grad for p in plain.parameters()]
    # 2. Frozen parameters keep grad None.
    frozen = small_model()
    frozen[0].weight.requires_grad_(False)
    F.cross_entropy(frozen(x), y).backward()
    ex.average_gradients(frozen)
    # 3. Inside a group of ranks 0 and 1 only: the mean over the group, not over the world.
    pair = dist.new_group([0, 1]) if WORLD > 1 else None
    in_pair = None
    if WORLD > 1 and RANK in (0, 1):
        model = small_model()
        for p in model.parameters():
            p.grad = torch.full_like(p, float(RANK + 1))
        ex.average_gradients(model, group=pair)
        in_pair = [p.grad for p in model.parameters()]
    return {"averaged": averaged, "frozen_grad_none": frozen[0].weight.grad is None,
            "in_pair": in_pair}


# --- l3_ddp_step ---------------------------------------------------------------------------

N, GLOBAL_BATCH, EPOCHS, SEED = 95, 12, 2, 5  # 95: the sampler pads at W = 2 and W = 3


def observe_train_ddp(ex):
    x, y = data(N, seed=7)
    watched = WatchedDataset(x, y)
    seen = case()
    trained = ex.train_ddp(small_model(seed=3), watched, global_batch=GLOBAL_BATCH,
                           epochs=EPOCHS, lr=0.1, seed=SEED)
    wrapper = isinstance(trained, DDP)
    if wrapper:
        trained = trained.module
    return dict(seen, returned_wrapper=wrapper,
                parameters=torch.cat([p.detach().flatten() for p in trained.parameters()]),
                read=watched.read)


CHECKS = {"average_gradients": (observe_average_gradients, GROUP_TIMEOUT),
          "train_ddp": (observe_train_ddp, GROUP_TIMEOUT)}
# train_ddp graded on its own: the reference builds on per_process_batch (l3_batch_and_lr),
# which is the grader's while train_ddp runs (probes.py)
GRADED_WITH = {"train_ddp": {"per_process_batch": "lesson3_per_process_batch"}}


if __name__ == "__main__":
    relayed_rank(3, CHECKS, "one lesson 3 grading check, as a relayed rank", GRADED_WITH)
