"""Grader code that must run beside the submission, in its sandboxed process; and the inputs
that both a grading job (workers/) and the judge build, so that both build the same.

A grading test calls `ex.probe("name", ...)`: the function here runs in the submission's
process (ddpcourse/course/sandbox_child.py) with the exercises module as its first argument
and returns data only; the test judges that data in its own process. A probe observes what
only the submission's process can see (a tensor changed in place, a forward's decision, the
global generator, a rename); what it reports the submission could forge, so every probe's
result that can be recomputed is recomputed by the judge (tests/grading/README.md). A probe
never judges: beside the submission any function it calls (torch.equal, ==, isinstance) may
be the submission's own, so it returns what it saw and every comparison is the judge's.
"""

import io
import os
import random
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# --- the grader's own versions of exercises that others build on --------------------------
# While an exercise whose reference calls another graded function is graded, that function is
# replaced in the submission's module by the one here, which takes the same arguments
# (Submission.options(replace=...) in the sandbox, GRADED_WITH in a worker): a mistake in
# global_rank costs l1_global_rank, not rank_layout too. Each is the reading's formula, right
# for every input its dependent exercise's tests give it.

def lesson1_global_rank(node_rank, local_rank, procs_per_node):
    """R = node_rank x procs_per_node + local_rank (rank_layout is graded with it)."""
    if node_rank < 0 or procs_per_node < 1 or not 0 <= local_rank < procs_per_node:
        raise ValueError(f"no process {local_rank} on node {node_rank} of {procs_per_node}")
    return node_rank * procs_per_node + local_rank


def lesson3_per_process_batch(global_batch, world_size):
    """Each process's equal share of the global batch (train_ddp is graded with it)."""
    if world_size < 1 or global_batch < 1 or global_batch % world_size:
        raise ValueError(f"a global batch of {global_batch} does not split over {world_size}")
    return global_batch // world_size


def lesson5_expand_nodelist(nodelist):
    """The node lists of lesson 5's identity tests expanded: comma-separated names, each plain
    or with one bracket of one number or range at its end (`node[5-7],login1`), numbers as
    wide as the range's first bound (identity_from_slurm is graded with it). Not SLURM's whole
    syntax, which is exercise l5_expand_nodelist: anything else is refused."""
    hosts = []
    for item in nodelist.split(","):
        name, bracket, inside = item.partition("[")
        if not bracket:
            hosts.append(name)
            continue
        low, _, high = inside.removesuffix("]").partition("-")
        if not inside.endswith("]") or not low.isdigit() or not (high or low).isdigit():
            raise ValueError(f"the grader's expand_nodelist cannot read {item!r}")
        hosts += [name + str(n).zfill(len(low)) for n in range(int(low), int(high or low) + 1)]
    return hosts


# --- lesson 3 --------------------------------------------------------------------------------

def lesson3_model(seed=0):
    """The job's model (workers/lesson3_ddp.py), built the same way by the judge."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))


def lesson3_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g), torch.randint(0, 4, (n,), generator=g)



def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))


def average_gradients_once(ex, x):
    """The gradients of tiny_model on x before and after average_gradients in a world of one."""
    model = tiny_model()
    model(x).sum().backward()
    before = [p.grad.clone() for p in model.parameters()]
    ex.average_gradients(model)
    return before, [p.grad for p in model.parameters()]


def class_names(cls):
    """The dotted names of a class and of every class it derives from: whether an object is
    a module or a loader, for the judge to decide."""
    return [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]


def train_ddp_once(ex, x, y):
    """(the classes of what train_ddp returned, the model's state before, and the state of
    what it returned) in a world of one."""
    from torch.utils.data import TensorDataset

    model = tiny_model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trained = ex.train_ddp(model, TensorDataset(x, y), global_batch=8, epochs=1, lr=0.1)
    state = trained.state_dict() if hasattr(trained, "state_dict") else {}
    return class_names(type(trained)), start, dict(state)


# --- lesson 4 --------------------------------------------------------------------------------

def secret_generator(secret, *salt):
    """A generator only the rank given `secret` (by the relay) and the judge can seed."""
    seed = secret
    for part in salt:
        seed = seed * 1_000_003 + part
    return torch.Generator().manual_seed(seed % (2**63 - 1))


def lesson4_data(secret: int, seed: int, shape, dtype):
    """A rank's input for case `seed` of a lesson 4 check, from the secret the relay gave that
    rank alone (ddpcourse/course/relay.py): the judge, which knows every rank's secret,
    builds the same; another rank cannot."""
    g = secret_generator(secret, seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def ring_all_reduce_once(ex, x):
    returned = ex.ring_all_reduce(x)
    return x, returned is x  # an identity only this process sees: an observation, not a verdict


def all_gather_once(ex, out, x):
    ex.all_gather_p2p(out, x)
    return out


def tree_broadcast_once(ex, x, root):
    ex.tree_broadcast(x, root)
    return x


def node_group_once(ex):
    group = ex.node_group()
    x = torch.tensor([3.0])
    ex.node_leader_broadcast(x, group)
    return dist.get_process_group_ranks(group), x


# --- lesson 6 --------------------------------------------------------------------------------

def global_generator_after(ex, seed, *args):
    """resume_indices' answer, and torch's global generator's state after it, seeded with
    `seed` before (the judge compares it with that seed's state)."""
    torch.manual_seed(seed)
    mine = ex.resume_indices(*args)
    return mine, torch.get_rng_state()


def capture_and_restore_once(ex):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    state = ex.capture_state(model, optimizer, scheduler, torch.Generator(),
                             {"epoch": 0, "start": 0, "step": 0})
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    ex.restore_state(torch.load(buffer, weights_only=False), model, optimizer, scheduler,
                     torch.Generator())


def snapshot_python_rng():
    """The state of Python's generator that snapshot_state holds (the judge builds it too)."""
    return random.Random(5).getstate()


def snapshot_state():
    """A snapshot as the course writes them: tensors, numbers, and Python's and NumPy's
    generator states (which torch.load's default, weights_only=True, refuses)."""
    import numpy as np

    np.random.seed(5)
    return {"weights": torch.arange(6.0), "step": 12, "python_rng": snapshot_python_rng(),
            "numpy_rng": np.random.get_state()}


def scratch(name):
    """A fresh folder in the submission's own writable space."""
    folder = os.path.join(os.environ.get("TMPDIR", "/tmp"), "probe", name)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    return folder


def step_in(path):
    """The step a snapshot file holds, read by the probe (never by the judge, which does not
    unpickle what a submission wrote)."""
    try:
        return int(torch.load(path, weights_only=False)["step"])
    except Exception as error:
        return f"unreadable: {type(error).__name__}"


def load_summary(ex, path, **kwargs):
    state, used = ex.load_snapshot(path, **kwargs)
    return {"used": used, "step": state.get("step"), "weights": state.get("weights"),
            "python_rng": state.get("python_rng"),
            "numpy_rng_kind": (state.get("numpy_rng") or [None])[0]}


def saved_twice(ex):
    path = os.path.join(scratch("saved_twice"), "new", "snap.pt")
    ex.save_snapshot(snapshot_state(), path)
    first = load_summary(ex, path)
    ex.save_snapshot({"step": 13}, path)
    return {"path": path, "first": first, "on_disk": step_in(path),
            "prev_on_disk": step_in(path + ".prev"), "second": load_summary(ex, path)}


def replace_everywhere(stack, ex, module, name, replacement):
    """module.<name> replaced, and the submission's own name for it (`from os import replace`),
    until the stack closes."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    stack.append((module, name, original))
    if getattr(ex, name, None) is original:
        setattr(ex, name, replacement)
        stack.append((ex, name, original))


@contextmanager
def replaced(ex, replacements):
    stack = []
    try:
        for module, name, replacement in replacements:
            replace_everywhere(stack, ex, module, name, replacement)
        yield
    finally:
        for owner, name, original in reversed(stack):
            setattr(owner, name, original)


def crash_while_writing(ex):
    """torch.save dies half-way through the second save: what is on disk afterwards."""
    path = os.path.join(scratch("crash"), "snap.pt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ex.save_snapshot({"step": 1}, path)
    real_save = torch.save

    def dies_half_way(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer)
        data = buffer.getvalue()[: len(buffer.getvalue()) // 2]
        if hasattr(f, "write"):
            f.write(data)
            f.flush()
        else:
            with open(f, "wb") as out:
                out.write(data)
        raise OSError(28, "No space left on device")

    raised = None
    with replaced(ex, [(torch, "save", dies_half_way)]):
        try:
            ex.save_snapshot({"step": 2, "weights": torch.zeros(1000)}, path)
        except OSError as error:
            raised = type(error).__name__
    return {"path": path, "raised": raised, "on_disk": step_in(path),
            "loaded": load_summary(ex, path)}


class WatchedFiles:
    """Records, in order, every rename (os.replace, os.rename, and what calls them:
    shutil.move, Path.replace) and every fsync, each with its file's (device, inode, size) at
    that moment: whether a renamed file had been fsynced with all its bytes is the judge's."""

    def __init__(self):
        # {"rename": (source, destination), "file": [device, inode, size] or None}
        # or {"fsync": [device, inode, size]}
        self.events = []

    def replacements(self):
        return [(os, name, watch(getattr(os, name))) for name, watch in
                [("replace", self.renaming), ("rename", self.renaming),
                 ("fsync", self.syncing), ("fdatasync", self.syncing)]]

    def renaming(self, real):
        def rename(source, destination, *args, **kwargs):
            try:
                facts = os.stat(source)
                file = [facts.st_dev, facts.st_ino, facts.st_size]
            except OSError:  # the rename itself will say what is wrong
                file = None
            self.events.append({"rename": (os.path.realpath(source),
                                           os.path.realpath(destination)), "file": file})
            return real(source, destination, *args, **kwargs)
        return rename

    def syncing(self, real):
        def sync(fd):
            facts = os.fstat(fd if isinstance(fd, int) else fd.fileno())
            self.events.append({"fsync": [facts.st_dev, facts.st_ino, facts.st_size]})
            return real(fd)
        return sync


def two_saves(ex):
    """save_snapshot into a new folder, then over that snapshot, watched: the snapshot's
    real path and, per save, (its real path after the save, the renames and fsyncs of the
    save in order)."""
    path = os.path.join(scratch("two_saves"), "run", "snap.pt")
    saves = []
    for step in (1, 2):
        watched = WatchedFiles()
        with replaced(ex, watched.replacements()):
            ex.save_snapshot({"step": step, "weights": torch.zeros(1000)}, path)
        saves.append((os.path.realpath(path), watched.events))
    return os.path.realpath(path), saves


def damaged(ex):
    path = os.path.join(scratch("damaged"), "snap.pt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ex.save_snapshot({"step": 1}, path)
    ex.save_snapshot({"step": 2}, path)
    data = open(path, "rb").read()
    with open(path, "wb") as f:  # truncated, as by a copy that stopped
        f.write(data[: len(data) // 3])
    truncated = load_summary(ex, path)
    with open(path, "wb") as f:  # garbage
        f.write(b"not a snapshot at all" * 10)
    return {"path": path, "truncated": truncated, "garbage": load_summary(ex, path)}


def no_usable_snapshot(ex, missing):
    """Raises what load_snapshot raises for a file of zeros (or a missing one)."""
    folder = scratch("unusable")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "missing" if missing else "", "snap.pt")
    if not missing:
        with open(path, "wb") as f:
            f.write(b"\x00" * 64)
    try:
        ex.load_snapshot(path)
    except Exception as error:
        error.args = (str(error).replace(path, "<path:snap.pt>"),)
        raise
    return "loaded"


def map_location_used(ex):
    path = os.path.join(scratch("map_location"), "snap.pt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ex.save_snapshot(snapshot_state(), path)
    seen = []

    def where(storage, location):
        seen.append(location)
        return storage

    state, _ = ex.load_snapshot(path, map_location=where)
    return seen, state.get("weights")


# --- lesson 7 --------------------------------------------------------------------------------

def sub_group_parts(world):
    """The job's sub-groups: the even ranks and the odd ones."""
    return [list(range(0, world, 2)), list(range(1, world, 2))]


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
CHANNELS = 3


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


def sync_bn_inputs(call, ranks, rank, generator, secrets, index):
    """One sync_batch_norm call's batch over a group, as the job and the judge both build it:
    (x for the whole group, dy, weight, bias, this rank's rows lo:hi). Member m's rows come
    from its secret (secrets[m]; a rank knows only its own, so the others' rows are zeros
    there), the weight and bias from `generator`; `index` numbers the call among the check's."""
    sizes, extra, _, eps = call
    weight0 = torch.rand(CHANNELS, generator=generator) + 0.5
    bias0 = torch.randn(CHANNELS, generator=generator)
    xs, dys = [], []
    for m, size in zip(ranks, sizes, strict=True):
        shape = (size, CHANNELS, *extra)
        if secrets.get(m) is None:
            xs.append(torch.zeros(shape))
            dys.append(torch.zeros(shape))
            continue
        g = secret_generator(secrets[m], index)
        xs.append(batch_of_channels(shape, eps, g))
        dys.append(torch.randn(shape, generator=g))
    position = ranks.index(rank)
    return torch.cat(xs), torch.cat(dys), weight0, bias0, sum(sizes[:position]), \
        sum(sizes[:position + 1])


def WORLD_SYNC_BN_CALLS(world):  # noqa: N802 (a table, as it was)
    """(the ranks' batch sizes, the dimensions after C, momentum, eps) of each call in the
    world group."""
    return [([2 + 3 * r for r in range(world)], (4, 4), 0.1, 1e-5),
            ([1 + 3 * r for r in range(world)], (), 0.3, 1e-3)]


def sync_bn_group_calls(ranks_in_group):
    return [([4 + 2 * i for i in range(ranks_in_group)], (3,), 0.2, 1e-4)]


def lesson7_step_data(step, group_ranks, rank, secret):
    """A rank's batch for a bucketed step, from its secret: different data, even a different
    size, per rank."""
    g = secret_generator(secret, step)
    n = 5 + group_ranks.index(rank)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def lesson7_micro_batches(step, secret, k=3, micro=4):
    """A rank's K micro-batches for an accumulation step, from its secret."""
    g = secret_generator(secret, 100 + step)
    return [(torch.randn(micro, 10, generator=g), torch.randint(0, 3, (micro,), generator=g))
            for _ in range(k)]


def bucketed_in_one_process(ex):
    """Two steps with BucketedAllReduce in a world of one: each step's gradients after
    finish() and a plain model's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    averager = ex.BucketedAllReduce(model, bucket_cap_bytes=100)
    steps = []
    for _ in range(2):
        x = torch.randn(5, 6)
        model.zero_grad()
        model(x).square().sum().backward()
        averager.finish()
        steps.append((x, [p.grad for p in model.parameters()]))
    return steps


def small_model():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))


lesson7_small_model = small_model  # the job's model too


class StandInForDDP(nn.Module):
    """What accumulation_step sees of DDP in a one-process test, without a process group:
    the module, and no_sync(). DDP decides at each forward whether the backward that follows
    will all-reduce the gradients, from require_backward_grad_sync (False inside no_sync) and
    whether grad is enabled: the stand-in notes both at each forward, and the judge decides.
    The real DDP grades the same code in the job."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True
        self.forwards: list[tuple] = []  # per forward: (require_backward_grad_sync, grad on)

    @contextmanager
    def no_sync(self):
        before = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def forward(self, *args, **kwargs):
        self.forwards.append((self.require_backward_grad_sync, torch.is_grad_enabled()))
        return self.module(*args, **kwargs)


def accumulation_data(k, steps):
    g = torch.Generator().manual_seed(k)
    return [[(torch.randn(4, 10, generator=g), torch.randint(0, 3, (4,), generator=g))
             for _ in range(k)] for _ in range(steps)]


def accumulate_in_one_process(ex, k, steps=2):
    """`steps` accumulation steps of k micro-batches of 4: the parameters after, per step the
    parameters it started from, what each forward saw of no_sync (StandInForDDP.forwards),
    the batch sizes the model itself saw, and the value returned."""
    model = small_model()
    wrapped = StandInForDDP(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    starts, forwards, sizes, returned = [], [], [], []
    # On the model itself, so a forward through ddp_model.module counts too.
    model.register_forward_pre_hook(lambda module, args: sizes[-1].append(len(args[0])))
    for micro_batches in accumulation_data(k, steps):
        starts.append({n: p.detach().clone() for n, p in model.state_dict().items()})
        wrapped.forwards = []
        sizes.append([])
        returned.append(ex.accumulation_step(wrapped, optimizer, micro_batches,
                                             F.cross_entropy))
        forwards.append(wrapped.forwards)
    return dict(model.state_dict()), starts, forwards, sizes, returned


# --- lesson 8 --------------------------------------------------------------------------------

ZERO_STEPS, ZERO_BATCH = 3, 12   # 12 samples: an equal share at W = 1, 2 and 3
PIPELINE_RUNS = [(3, 12), (4, 8)]   # (micro-batches, batch)
HIDDEN = 16


def lesson8_zero_model():
    """Parameters of many sizes (24 to 576 elements), so the split by size matters."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(),
                         nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 4))


def lesson8_idle_model(world):
    """Fewer parameters than ranks (one at W = 2, two at W = 3): the last rank owns none."""
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(24, 4, bias=world > 2))


def lesson8_zero_batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(ZERO_BATCH, 24, generator=g), torch.randint(0, 4, (ZERO_BATCH,),
                                                                   generator=g)


def lesson8_pipeline_batch(secret, micro, batch):
    """A pipeline run's (inputs, labels), from a stage's secret (a relayed job's): stage 0
    holds the inputs made from its own, stage 1 the labels made from its own, so each stage
    needs what the other sends; the judge, which knows both secrets, builds the same."""
    g = secret_generator(secret, micro)
    return torch.randn(batch, 10, generator=g), torch.randint(0, 5, (batch,), generator=g)


def lesson8_stages():
    torch.manual_seed(1)
    first = nn.Sequential(nn.Linear(10, HIDDEN), nn.Tanh())
    second = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 5))
    return first, second


class RanTheStage(Exception):
    pass


def stage_that_must_not_run():
    def refuse(module, args):
        raise RanTheStage("the stage ran: pipeline_step must refuse a group that is not two "
                          "ranks before it runs anything")
    stage = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    stage.register_forward_pre_hook(refuse)
    return stage


def pipeline_in_a_world_of_one(ex, batch, micro_batches, shape):
    return ex.pipeline_step(stage_that_must_not_run(), torch.randn(*batch), micro_batches,
                            shape)


def zero1_first_call(ex):
    model = nn.Linear(3, 2)
    zero = ex.Zero1Optimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    zero.step()


def zero1_in_a_world_of_one(ex, x, y):
    """Two Adam steps through Zero1Optimizer in a world of one: the state after, the
    gradients after zero_grad() and after zero_grad(set_to_none=False), the owners."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    zero = ex.Zero1Optimizer(model.parameters(), torch.optim.Adam, lr=0.05)
    for _ in range(2):
        nn.functional.cross_entropy(model(x), y).backward()
        zero.step()
        zero.zero_grad()
    grads_after_zero_grad = [p.grad for p in model.parameters()]
    nn.functional.cross_entropy(model(x), y).backward()
    zero.zero_grad(set_to_none=False)
    return {"params": [p.detach() for p in model.parameters()],
            "grads_after_zero_grad": grads_after_zero_grad,
            "grads_after": [p.grad for p in model.parameters()],
            "owners": [int(o) for o in zero.owners]}


# --- lesson 9 --------------------------------------------------------------------------------

def lesson9_groups(world):
    """The sub-groups of the `groups` check: the world cut in two, group ranks not global."""
    return [[0], [1]] if world == 2 else [[0, 2], [1]]


def lesson9_case(case, world):
    """(length of the validation set, every rank's indices, in rank order) for a case of
    workers/lesson9_validation.py or a world-of-one probe; the judge rebuilds the same."""
    from torch.utils.data import DistributedSampler

    def sampled(length, shuffle, seed=9):
        return [list(DistributedSampler(range(length), num_replicas=world, rank=r,
                                        shuffle=shuffle, seed=seed)) for r in range(world)]

    if case == "padded":        # 9 over 2, 13 over 3 (the sampler repeats samples), 5 over 1
        return 4 * world + 1, sampled(4 * world + 1, shuffle=True)
    if case == "uneven":        # a rank with none, and samples evaluated twice on one rank
        shares = {1: [[0, 1, 2, 3, 4, 5, 6, 0, 1]], 2: [[], [0, 1, 2, 3, 4, 5, 6, 3, 3]],
                  3: [[0, 1, 2, 3, 4, 0], [5, 6, 5], []]}
        return 7, shares[world]
    if case == "missing":       # sample 5 evaluated by no rank
        return 6, [[i for i in range(5) if i % world == r] for r in range(world)]
    if case == "bad":           # three indices, two results: see lesson9_shares
        return 5, [[0, 1, 2]] * world
    if case.startswith("group"):  # group i's own validation set, over its own ranks
        length = 5  # both groups: code that reduces over the world instead runs, wrongly
        if world == 1:          # a group of one: every sample once, the first twice
            return length, [list(range(length)) + [0]]
        return length, sampled(length, shuffle=False)
    raise ValueError(case)


def lesson9_truth(case, length):
    """Whether the model got each sample right: the same on every rank (the same weights).
    In the uneven case and group 1 the samples given twice (0 to 3) are right, so counting
    them twice shows; in the padded cases the repeated samples move the accuracy too."""
    g = torch.Generator().manual_seed(sum(map(ord, case)))
    truth = torch.rand(length, generator=g) < 0.45
    if case in ("uneven", "group1"):
        truth[:4] = True
    return truth


def lesson9_shares(case, world, rank):
    """(indices, correct, length): what a rank of `case` hands exact_accuracy."""
    length, shares = lesson9_case(case, world)
    indices = shares[rank]
    correct = lesson9_truth(case, length)[indices]
    if case == "bad":
        correct = correct[:2]
    return indices, correct, length


def exact_accuracy_alone(ex, case):
    """exact_accuracy in the sandbox's world of one: (value, one line of what it raised)."""
    indices, correct, length = lesson9_shares(case, 1, 0)
    try:
        return ex.exact_accuracy(indices, correct, length), None
    except ValueError as error:
        return None, f"{type(error).__name__}: {error}"[:300]


class Lesson9Indices(torch.utils.data.Dataset):
    """Sample i is the number i: a loader's batches are the indices it read."""

    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return index


def lesson9_loader(spec):
    """The loader a shard_loader probe hands over, from a spec the judge reads too:
    {"length", "batch_size", "shuffle", "drop_last", "collate": "default" | "pairs",
     "sharded": None | (rank, world), "batch_sampler": bool, "sampler": None | "weighted"}."""
    from torch.utils.data import (
        BatchSampler,
        DataLoader,
        DistributedSampler,
        SequentialSampler,
        WeightedRandomSampler,
    )

    dataset = Lesson9Indices(spec["length"])
    collate = (lambda batch: [(i, -i) for i in batch]) if spec.get("collate") == "pairs" \
        else None
    if spec.get("batch_sampler"):
        return DataLoader(dataset, batch_sampler=BatchSampler(
            SequentialSampler(dataset), spec["batch_size"], drop_last=False))
    sampler = None
    if spec.get("sharded"):
        rank, world = spec["sharded"]
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                     shuffle=spec["shuffle"], seed=spec.get("seed", 0))
    elif spec.get("sampler") == "weighted":
        sampler = WeightedRandomSampler([1.0] * spec["length"], spec["length"])
    return DataLoader(dataset, batch_size=spec["batch_size"], drop_last=spec["drop_last"],
                      collate_fn=collate, sampler=sampler, num_workers=spec.get("num_workers", 0),
                      shuffle=spec["shuffle"] if sampler is None else None)


def sharded_epochs(ex, spec, rank, world, seed=0, epochs=2):
    """shard_loader's loader read for `epochs` epochs, set_epoch(e) called on its sampler
    before each, as lesson 3's loop does: every batch as a list of sample indices (or, with
    the "pairs" collate, of pairs). Also what the loader keeps."""
    loader = ex.shard_loader(lesson9_loader(spec), rank, world, seed=seed)
    sampler = getattr(loader, "sampler", None)
    read = []
    for epoch in range(epochs):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        read.append([[list(map(int, item)) if isinstance(item, tuple) else int(item)
                      for item in batch] for batch in loader])
    # Whether the sampler has set_epoch only this process can see: an observation.
    return {"read": read, "loader_classes": class_names(type(loader)),
            "set_epoch": hasattr(sampler, "set_epoch"),
            "num_workers": getattr(loader, "num_workers", None)}


# --- lesson 10 -------------------------------------------------------------------------------

LESSON10_BLOCK = 3                  # positions of the sequence per rank (ring attention)
LESSON10_SHAPE = (2, 2, 4)          # batch, heads, head_dim
LESSON10_FEATURES = (4, 3)          # an expert: Linear(4, 3)


def lesson10_sub_groups(world):
    """The sub-groups of the ring and MoE group checks: global rank 0 alone, and the others,
    whose group ranks are their global ranks minus one."""
    return [[0], list(range(1, world))]


def lesson10_attention(case, world, secrets=None):
    """(Q, K, V) of a whole sequence of LESSON10_BLOCK x world positions; group rank r of the
    check holds positions r x block to (r + 1) x block - 1 of each. "large": scores in the
    hundreds, whose exponentials overflow float32 unless shifted by their maximum. With
    `secrets` (a relayed job's, one per group rank), block r is lesson10_attention_block(case,
    secrets[r]): what only rank r can make."""
    if secrets is not None:
        blocks = [lesson10_attention_block(case, secret) for secret in secrets]
        return tuple(torch.cat([b[i] for b in blocks], dim=-2) for i in range(3))
    g = torch.Generator().manual_seed(1000 * world + sum(map(ord, case)))
    return _attention_inputs(case, LESSON10_BLOCK * world, g)


def lesson10_attention_block(case, secret):
    """A relayed rank's own (Q, K, V) block, from the secret the relay gave it alone."""
    g = secret_generator(secret, sum(map(ord, case)))
    return _attention_inputs(case, LESSON10_BLOCK, g)


def _attention_inputs(case, positions, g):
    batch, heads, dim = LESSON10_SHAPE
    q, k, v = (torch.randn(batch, heads, positions, dim, generator=g) for _ in range(3))
    if case == "large":
        q, k = q * 12, k * 12
    return q, k, v


def lesson10_block(tensor, rank):
    return tensor[..., rank * LESSON10_BLOCK:(rank + 1) * LESSON10_BLOCK, :].contiguous()


def lesson10_experts(world):
    """The E = 2 x world experts of a MoE check, in expert order (the judge builds the same)."""
    with torch.random.fork_rng():
        torch.manual_seed(77 + world)
        return [nn.Linear(*LESSON10_FEATURES) for _ in range(2 * world)]


def lesson10_tokens(case, world, secrets=None):
    """Every rank's lesson10_share: [(tokens, expert ids, probe)] in rank order."""
    return [lesson10_share(case, world, rank, None if secrets is None else secrets[rank])
            for rank in range(world)]


def lesson10_share(case, world, rank, secret=None):
    """Rank `rank`'s (tokens, expert ids, the probe its output is multiplied by for
    backward) in a MoE check: uneven counts per rank; "uneven": rank 0 sends everything to
    the last expert and expert 1 gets nothing; "empty": rank 1 has no tokens at all and only
    the first and last experts get any. With `secret` (a relayed rank's), the tokens and the
    probe come from it: only that rank can make them; the ids never do."""
    g = torch.Generator().manual_seed(500 + 10 * world + len(case) + 1000 * rank)
    experts, d_in, d_out = 2 * world, *LESSON10_FEATURES
    count = 0 if case == "empty" and rank == 1 else 3 + 2 * rank
    if case == "empty":
        ids = torch.where(torch.rand(count, generator=g) < 0.5, 0, experts - 1)
    elif rank == 0:
        ids = torch.full((count,), experts - 1)
    else:
        ids = torch.randint(0, experts - 1, (count,), generator=g)
        ids = torch.where(ids == 1, experts - 1, ids)
    own = g if secret is None else secret_generator(secret, len(case))
    return (torch.randn(count, d_in, generator=own), ids.long(),
            torch.randn(count, d_out, generator=own))


def lesson10_alone(ex, which):
    """ring_attention and moe_dispatch in the sandbox's world of one: what each returns."""
    from datetime import timedelta

    if which == "mesh":
        groups = ex.mesh_groups((1, 1), ("dp", "tp"), timedelta(seconds=20))
        return {name: dist.get_process_group_ranks(group) for name, group in groups.items()}
    if which in ("plain", "causal"):
        q, k, v = lesson10_attention(which, 1)
        return ex.ring_attention(q, k, v, causal=which == "causal")
    if which == "refused":
        q, k, v = lesson10_attention("plain", 1)
        try:
            ex.ring_attention(q, k[..., :2, :], v)
        except ValueError as error:
            return f"ValueError: {error}"[:300]
        return None
    experts = lesson10_experts(1)
    tokens, ids, probe = lesson10_tokens("uneven", 1)[0]
    tokens.requires_grad_()
    out = ex.moe_dispatch(tokens, ids, experts, len(experts))
    try:
        (out * probe).sum().backward()
    except RuntimeError:  # not differentiable: the gradients stay None
        pass
    return {"out": out.detach(), "tokens": tokens.grad,
            "experts": [[p.grad for p in e.parameters()] for e in experts]}
