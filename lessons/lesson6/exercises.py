"""Lesson 6 exercises: where a resumed epoch goes on, what a snapshot must hold, and how to
write one that a crash cannot damage.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=6                                    # all of lesson 6, with a score table
    .venv/bin/pytest tests/grading -m l6_snapshot_state     # one exercise

l6_snapshot_state is graded by a kill: the grader trains under torchrun with your two
functions, sends SIGKILL to a worker mid-run, lets torchrun restart the job, and compares the
final weights with a run that never stopped. Bit-identical, or no points.
"""

from __future__ import annotations


def resume_indices(num_samples: int, seed: int, epoch: int, start: int, rank: int,
                   world_size: int) -> list[int]:
    """Exercise l6_resume_position: this rank's sample indices for the rest of an epoch.

    The epoch's order is DistributedSampler's (shuffle=True, drop_last=False): a permutation
    of range(num_samples) from a torch.Generator seeded with seed + epoch, padded by
    repeating its beginning up to a multiple of world_size. `start` is how many positions of
    that padded order the job has already trained, counted over all ranks (a step of global
    batch B uses B positions). Return the positions from `start` on that belong to `rank`:
    every world_size-th one, beginning with the rank's own offset.

    - start=0 gives exactly what DistributedSampler(...).set_epoch(epoch) gives the rank;
    - resuming at start = k*B gives each rank the batches it would have had at step k;
    - world_size may differ from the run that wrote `start` (an elastic job shrank or grew):
      the ranks together still get every remaining position exactly once.
    """
    raise NotImplementedError("l6_resume_position: the rest of the epoch, for this rank")


def capture_state(model, optimizer, scheduler, generator, progress: dict) -> dict:
    """Exercise l6_snapshot_state: everything this rank needs to continue training exactly.

    `model` is the plain module (not the DDP wrapper), `generator` a torch.Generator the
    training draws from (this rank's data augmentation), `progress` a small dict (epoch,
    position, step) to hand back on restore. Training also draws from torch's global random
    generator (dropout). Return a dict that torch.save can write.
    """
    raise NotImplementedError("l6_snapshot_state: capture what shapes the rest of training")


def restore_state(state: dict, model, optimizer, scheduler, generator) -> dict:
    """Exercise l6_snapshot_state: put a captured state back; return its `progress` dict.

    `state` is what capture_state returned, after a round trip through torch.save and
    torch.load (with map_location, so its tensors are on this process's device).
    """
    raise NotImplementedError("l6_snapshot_state: restore what capture_state kept")


class SnapshotError(Exception):
    """No usable snapshot: the message names the file(s) and what is wrong."""


def save_snapshot(state: dict, path: str) -> None:
    """Exercise l6_atomic_snapshot: write `state` (torch.save) to `path`, safely.

    - At every moment `path` holds a complete snapshot or none: a crash while writing (the
      process killed, the disk full) must leave the previous file untouched.
    - The snapshot it replaces is kept as path + ".prev".
    - Create the folder if it is missing.
    """
    raise NotImplementedError("l6_atomic_snapshot: write a snapshot no crash can damage")


def load_snapshot(path: str, map_location="cpu") -> tuple[dict, str]:
    """Exercise l6_atomic_snapshot: (state, the file it came from).

    Try `path`, then path + ".prev": a file that is missing, or that torch.load cannot read
    (truncated, corrupt), is skipped. Load with `map_location`. When neither can be loaded,
    raise SnapshotError with a one-line message naming the file(s) and what went wrong.
    """
    raise NotImplementedError("l6_atomic_snapshot: load the newest snapshot that is whole")
