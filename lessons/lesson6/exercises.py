"""Lesson 6 exercises: where a resumed epoch goes on, what a snapshot must hold, and how to
write one that a crash cannot damage.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=6                                    # all of lesson 6, with a score table
    .venv/bin/pytest tests/grading -m l6_snapshot_state     # one exercise

Each docstring ends with what the grader checks (lessons/lesson6/grading.md has every check).
l6_snapshot_state is graded by a kill: the grader trains under torchrun with your two
functions, sends SIGKILL to a worker mid-run, lets torchrun restart the job, and compares the
final weights and buffers with a run that never stopped. Bit-identical, or no points.

scripts/lesson6_resumable.py runs these functions too (make lesson6): write them, and the
lesson's step survives a kill with your code.
"""

from __future__ import annotations


def resume_indices(num_samples: int, seed: int, epoch: int, start: int, rank: int,
                   world_size: int) -> list[int]:
    """Exercise l6_resume_position: this rank's sample indices for the rest of an epoch.

    The epoch's order is DistributedSampler's (shuffle=True, drop_last=False): a permutation
    of range(num_samples) from a torch.Generator seeded with seed + epoch, padded up to a
    multiple of world_size by repeating the order from its beginning, as many times as that
    takes (more than once when there are more ranks than samples). `start` is how many
    positions of that padded order the job has already trained, counted over all ranks (a
    step of global batch B uses B positions). Return the positions from `start` on that
    belong to `rank`: every world_size-th one, beginning with the rank's own offset.

    - start=0 gives exactly what DistributedSampler(...).set_epoch(epoch) gives the rank;
    - resuming at start = k*B gives each rank the batches it would have had at step k;
    - world_size may differ from the run that wrote `start` (an elastic job shrank or grew):
      the ranks together still get every remaining position exactly once;
    - a start at or past the end of the padded order leaves nothing: an empty list.

    Training draws from torch's global random generator (dropout): working out the order
    must neither reseed it nor draw from it.

    Graded (12 points): compared with DistributedSampler itself at start 0 (3 to 1438
    samples, 1 to 4 ranks, several epochs); every step of an epoch resumed at the same world
    size; the rest of an epoch at 1 to 4 ranks after 3 trained part of it; 1 to 5 samples on
    up to 8 ranks, with every start up to and past the end; the global generator's state
    unchanged by the call.
    """
    raise NotImplementedError("l6_resume_position: the rest of the epoch, for this rank")


def capture_state(model, optimizer, scheduler, generator, progress: dict) -> dict:
    """Exercise l6_snapshot_state: everything this rank needs to continue training exactly.

    `model` is the plain module (not the DDP wrapper), `generator` a torch.Generator the
    training draws from (this rank's data augmentation), `progress` a small dict (epoch,
    start, step) to hand back on restore. Training also draws from torch's global random
    generator (dropout), from Python's `random` and from NumPy's global generator (other
    augmentations); on a GPU machine, from CUDA's generators too. Return a dict that
    torch.save can write.

    Graded (9 points, with restore_state): a kill under torchrun at 1, 2 and 3 ranks (3
    points each). A small DDP model with BatchNorm and dropout, per-rank input noise from
    `generator`, a sign flip per sample from Python's `random` and a scale per sample from
    NumPy's global generator (seeded per rank), SGD with momentum and a cosine schedule.
    Every rank snapshots itself every 3 steps (capture_state, then torch.save to a file of
    its own), one rank is killed at step 8, torchrun restarts every worker, each rank
    restores and trains to the end. Its final weights and buffers must equal those of a run
    that never stopped, bit for bit. The job runs on CPUs, with gloo.
    """
    raise NotImplementedError("l6_snapshot_state: capture what shapes the rest of training")


def restore_state(state: dict, model, optimizer, scheduler, generator) -> dict:
    """Exercise l6_snapshot_state: put a captured state back; return its `progress` dict.

    `state` is what capture_state returned, after a round trip through torch.save and
    torch.load(path, map_location=..., weights_only=False): its tensors are on this
    process's device (the grader's job loads with map_location="cpu"), and the full
    unpickler gives back any Python object capture_state put in. Return the `progress`
    dict capture_state was given; the job reads its "epoch", "start" and "step".

    Graded with capture_state (see there). Before any job starts, the grader also calls
    both once in its own process on a tiny model, so that a stub fails at once.
    """
    raise NotImplementedError("l6_snapshot_state: restore what capture_state kept")


class SnapshotError(Exception):
    """No usable snapshot: the message names the file(s) and what is wrong."""


def save_snapshot(state: dict, path: str) -> None:
    """Exercise l6_atomic_snapshot: write `state` (torch.save) to `path`, safely.

    - At every moment `path` holds a complete snapshot or none: a crash while writing (the
      process killed, the disk full) must leave the previous file untouched. An error while
      writing goes on to the caller.
    - The new snapshot reaches `path` by a rename, from the snapshot's own folder (a rename
      is atomic only within one file system), and only once its bytes are on the disk.
    - The snapshot it replaces is kept as path + ".prev"; the first save has none to keep.
    - Create the folder if it is missing.

    `state` may hold Python's and NumPy's generator states, not only tensors.

    Graded (15 points, with load_snapshot): two saves into a new folder, then the newest
    loaded and the first kept as .prev (3); torch.save dying half-way with OSError leaves
    the old snapshot whole (4); at both saves the file renamed onto `path` comes from its
    folder (2) and was fsynced with all its bytes first (2). Not graded, but in the reading:
    the folder's own fsync, so that the rename survives a power cut.
    """
    raise NotImplementedError("l6_atomic_snapshot: write a snapshot no crash can damage")


def load_snapshot(path: str, map_location="cpu") -> tuple[dict, str]:
    """Exercise l6_atomic_snapshot: (state, the file it came from).

    Try `path`, then path + ".prev": a file that is missing, or that torch.load cannot read
    (truncated, corrupt), is skipped. Load with `map_location`. When neither can be loaded,
    raise SnapshotError with a one-line message naming the file(s) and what went wrong.

    Snapshots hold NumPy's generator state, which torch.load's default (weights_only=True,
    since torch 2.6) refuses: load with weights_only=False, which unpickles any object, so
    only snapshots your own job wrote.

    Graded (with save_snapshot): with two whole snapshots, the newest (3, above); the newest
    truncated, then garbled: .prev's state and path (2); a file of zeros and no .prev, and a
    snapshot in a missing folder: SnapshotError, one line, naming the file (1); a callable
    map_location is used (1).
    """
    raise NotImplementedError("l6_atomic_snapshot: load the newest snapshot that is whole")
