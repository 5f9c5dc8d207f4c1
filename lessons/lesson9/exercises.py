"""Lesson 9 exercises: what the libraries do for you, done by hand. Who a process is, whichever
launcher started it; a DataLoader sharded over the ranks once, as Fabric shards yours (the
Trainer also shuffles a training loader that read in order; Accelerate's prepare() deals out
whole batches instead); a validation accuracy over the ranks equal to one process's.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=9                                       # all of lesson 9, with a score table
    .venv/bin/pytest tests/grading -m l9_exact_validation      # one exercise

None of them needs Lightning, Accelerate or DeepSpeed: write them with torch alone (the
grader's machine may not have those libraries). Your code runs in a sandboxed process of its
own: l9_launcher_identity and l9_shard_loader there alone; l9_exact_validation there in a
world of one, then in torchrun jobs of 2 and 3 processes, in the world and in sub-groups,
where every collective your code starts is recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist  # noqa: F401  (you will need it)
from torch.utils.data import DataLoader

# --- l9_launcher_identity ------------------------------------------------------------------


def identity_from_launcher(environ: Mapping[str, str], argv: Sequence[str] = (),
                           devices_per_node: int | None = None) -> dict[str, int]:
    """Exercise l9_launcher_identity: who this process is, whichever launcher started it.

    Return {"rank", "local_rank", "node_rank", "world_size"} (ints) from `environ` (never
    os.environ) and the script's arguments `argv`. What each launcher sets (the table of
    `make lesson9-launchers` shows the first three; lesson 5 shows srun's):

    - torchrun, and accelerate launch when it starts several processes through torchrun
      (`--multi_gpu`): RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK (the node
      rank);
    - deepspeed: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE and CROSS_RANK (the node rank), and
      `--local_rank=N` among the script's arguments (accept `--local_rank N` too);
    - Lightning's own launcher (the Trainer or Fabric started by plain python): LOCAL_RANK,
      NODE_RANK and WORLD_SIZE, and no RANK: the global rank is NODE_RANK x devices_per_node
      + LOCAL_RANK, where devices_per_node is the Trainer's `devices` (the caller passes it;
      without it, raise);
    - mpirun (Open MPI): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
      OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_LOCAL_SIZE (the node rank: rank // local size,
      as mpirun's default mapping, by slot, places them);
    - srun (SLURM, lesson 5): SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS and SLURM_NODEID.

    Launchers nest: torchrun started by srun sees srun's variables too, and there
    SLURM_PROCID numbers srun's tasks (one torchrun per node), not the ranks. So take the
    first set that is whole in the order above (RANK, LOCAL_RANK and WORLD_SIZE; then
    LOCAL_RANK and WORLD_SIZE; then Open MPI's; then SLURM's), and where a set has no node
    rank, derive it from the rank and the processes per node (0 when neither is known).

    Raise ValueError, in one line that says what disagrees, when no set is whole, a value is
    not a whole number, or the set is impossible: a rank outside 0..world-1; a local rank
    outside 0..(processes per node)-1; a rank that is not node rank x processes per node +
    local rank (where processes per node are known: LOCAL_WORLD_SIZE, LOCAL_SIZE,
    OMPI_COMM_WORLD_LOCAL_SIZE or devices_per_node), or a world that is not a whole number of
    such nodes; a --local_rank argument that is not LOCAL_RANK.
    """
    raise NotImplementedError("l9_launcher_identity")


# --- l9_shard_loader -----------------------------------------------------------------------

def shard_loader(loader: DataLoader, rank: int, world_size: int, seed: int = 0) -> DataLoader:
    """Exercise l9_shard_loader: what Fabric does to your loader (and the Trainer, but for
    shuffling every training loader), done once.

    Return a DataLoader over the same dataset that gives rank `rank` of `world_size` its share
    of every epoch, exactly as lesson 3's DistributedSampler(dataset, world_size, rank,
    shuffle, seed) does (equal shares, the first samples repeated to fill the last ones), and
    whose `.sampler` has set_epoch, for the training loop to call each epoch (lesson 3).
    Keep what the loader was: its batch_size, drop_last, collate_fn and num_workers; shuffled
    if it shuffled (its sampler is a RandomSampler: then by `seed` and the epoch), in order if
    it did not (a SequentialSampler).

    A loader whose sampler is already a DistributedSampler for this rank and world size is
    returned as it is: sharding it again would leave each rank 1/W of its share. Raise
    ValueError when its DistributedSampler is for another rank or world size, when the loader
    has another sampler or a batch_sampler of its own (splitting those would change what
    they do), and for a rank outside 0..world_size-1.
    """
    raise NotImplementedError("l9_shard_loader")


# --- l9_exact_validation -------------------------------------------------------------------

def exact_accuracy(indices: Sequence[int], correct: torch.Tensor, length: int,
                   group=None) -> float:
    """Exercise l9_exact_validation: a validation accuracy over the ranks of `group` (None: the
    world), equal to the one a single process computes over the whole set.

    Every rank of `group` evaluated some samples of a validation set of `length` samples:
    `indices` are the dataset indices this rank evaluated, and `correct[i]` (a bool tensor)
    says whether its prediction for indices[i] was right. The shares may come from a
    DistributedSampler, which pads: when length % W != 0 some samples were evaluated on two
    ranks (or more, with more ranks than samples); or they may be uneven: a sample twice on
    one rank, a rank with none. The same weights on every rank: a sample evaluated twice is
    right both times or neither.

    Return, on every rank of `group`, the same Python float: the fraction of the `length`
    samples predicted right, each counted once. Use collectives of `group` only. Raise
    ValueError (on every rank of the group, so that none is left waiting) when some sample
    was evaluated by no rank; and, before any collective, when `indices` and `correct`
    differ in length or an index is outside 0..length-1.
    """
    raise NotImplementedError("l9_exact_validation")
