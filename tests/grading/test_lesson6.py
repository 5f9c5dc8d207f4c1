"""Grading tests for lesson 6. resume_indices is compared with DistributedSampler itself and
with a resumed epoch's arithmetic; capture_state/restore_state are graded by a real kill
under torchrun (bit-identical or no points); save_snapshot/load_snapshot by crashes, damaged
files and the previous snapshot."""

import io
import os
import random
import tempfile

import numpy as np
import pytest
import torch
from jobs import Job, run_job, will_launch, world_of_one
from torch.utils.data import DistributedSampler

from ddpcourse.exercises import load_exercises

# world size -> its job. One restart is needed; the others let a restart that fails for
# another reason (a busy machine) try again: a second resume starts from the resumed run's
# own snapshots.
JOBS = {w: Job(f"lesson6_W{w}", "lesson6_resume.py", nproc=w, timeout=240, restarts=3)
        for w in (1, 2, 3)}


@pytest.fixture(scope="module")
def ex():
    return load_exercises(6)


def sampler_indices(n, seed, epoch, rank, world):
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True,
                                 seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


# --- l6_resume_position ------------------------------------------------------------------

def padded_order(n, seed, epoch, world):
    """DistributedSampler's whole padded order at `world` ranks: rank r holds positions r,
    r + world, ... of it."""
    per_rank = [sampler_indices(n, seed, epoch, rank, world) for rank in range(world)]
    return [per_rank[i % world][i // world] for i in range(len(per_rank[0]) * world)]


@pytest.mark.l6_resume_position
@pytest.mark.points(2)
def test_from_the_start_it_is_distributed_samplers_split(ex):
    for n, world in [(10, 1), (10, 3), (11, 4), (1438, 3), (7, 2), (3, 4)]:
        for epoch in (0, 1, 5):
            for rank in range(world):
                assert ex.resume_indices(n, 3, epoch, 0, rank, world) == \
                    sampler_indices(n, 3, epoch, rank, world), (n, world, epoch, rank)


@pytest.mark.l6_resume_position
@pytest.mark.points(2)
def test_resumed_part_way_each_rank_gets_the_batches_it_would_have_had(ex):
    """Step k of an uninterrupted epoch with global batch B is rank r's k-th slice of B/W."""
    for n, world, batch in [(1438, 3, 255), (96, 2, 24), (50, 4, 8), (10, 1, 4)]:
        per_rank = batch // world
        for epoch in (0, 2):
            for rank in range(world):
                full = sampler_indices(n, 0, epoch, rank, world)
                for k in range(1, -(-n // batch)):
                    assert ex.resume_indices(n, 0, epoch, k * batch, rank, world) == \
                        full[k * per_rank:], (n, world, batch, epoch, rank, k)


@pytest.mark.l6_resume_position
@pytest.mark.points(4)
def test_at_another_world_size_the_rest_of_the_epoch_is_trained_once(ex):
    """An elastic job: 3 ranks trained `start` positions, then 2 (or 4) go on."""
    n, seed, epoch = 1438, 0, 1
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=generator).tolist()
    for start, world in [(765, 2), (765, 4), (1020, 1), (255, 3)]:
        rest = [i for r in range(world) for i in ex.resume_indices(n, seed, epoch, start, r,
                                                                  world)]
        padding = -(-n // world) * world - n  # as DistributedSampler pads the epoch at W
        assert sorted(rest) == sorted(order[start:] + order[:padding]), (start, world)
        mine = ex.resume_indices(n, seed, epoch, start, 1 % world, world)
        assert mine[:3] == order[start + 1 % world::world][:3], (start, world)


@pytest.mark.l6_resume_position
@pytest.mark.points(2)
def test_datasets_smaller_than_the_world_and_the_end_of_the_epoch(ex):
    """More ranks than samples: the padding repeats the order more than once (1 sample on 3
    ranks, 3 on 8); one rank alone; any start, up to and past the end of the padded order,
    where nothing is left."""
    for n, world in [(1, 1), (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (2, 5), (3, 8), (5, 4)]:
        for epoch in (0, 3):
            order = padded_order(n, 5, epoch, world)
            for start in range(len(order) + 3):
                for rank in range(world):
                    assert ex.resume_indices(n, 5, epoch, start, rank, world) == \
                        order[start:][rank::world], (n, world, epoch, start, rank)


@pytest.mark.l6_resume_position
@pytest.mark.points(2)
def test_torchs_global_generator_is_left_alone(ex):
    """The training's dropout draws from torch's global generator: working out the positions
    must neither reseed it nor draw from it (the numbers it gives next stay the same)."""
    for n, world, epoch, rank in [(10, 3, 1, 2), (7, 2, 4, 0), (1, 1, 0, 0)]:
        torch.manual_seed(1234)
        before = torch.get_rng_state()
        mine = ex.resume_indices(n, 11, epoch, 0, rank, world)
        assert mine == sampler_indices(n, 11, epoch, rank, world), (n, world, epoch, rank)
        assert torch.equal(torch.get_rng_state(), before), \
            "resume_indices changed the state of torch's global random generator"


# --- l6_snapshot_state -------------------------------------------------------------------

def kill_and_resume(ex, world):
    """The kill-and-resume job at `world` ranks (workers/lesson6_resume.py) must report a
    bit-identical end. Before a launch the two functions are called once here, so that an
    unfinished exercise fails at once."""
    if will_launch(JOBS[world]):
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
        with world_of_one():
            state = ex.capture_state(model, optimizer, scheduler, torch.Generator(),
                                     {"epoch": 0, "start": 0, "step": 0})
            buffer = io.BytesIO()
            torch.save(state, buffer)
            buffer.seek(0)
            ex.restore_state(torch.load(buffer, weights_only=False), model, optimizer,
                             scheduler, torch.Generator())
    work = tempfile.mkdtemp(prefix=f"lesson6-resume-W{world}-")
    result = run_job(JOBS[world], script_args=["--work", work])
    lines = [line for line in result.stdout.splitlines() if line.startswith("resume: ")]
    assert lines == [f"resume: ok, bit-identical at {world} ranks"], \
        (result.stdout + result.stderr)[-3000:]


@pytest.mark.l6_snapshot_state
@pytest.mark.points(3)
def test_killed_and_restarted_one_rank_ends_bit_identical(ex):
    kill_and_resume(ex, 1)


@pytest.mark.l6_snapshot_state
@pytest.mark.points(3)
def test_killed_and_restarted_two_ranks_end_bit_identical(ex):
    kill_and_resume(ex, 2)


@pytest.mark.l6_snapshot_state
@pytest.mark.points(3)
def test_killed_and_restarted_three_ranks_end_bit_identical(ex):
    kill_and_resume(ex, 3)


# --- l6_atomic_snapshot ------------------------------------------------------------------

# A snapshot as the course writes them: tensors, numbers, and Python's and NumPy's generator
# states (which torch.load's default, weights_only=True, refuses).
STATE = {"weights": torch.arange(6.0), "step": 12, "python_rng": random.getstate(),
         "numpy_rng": np.random.get_state()}


def replace_everywhere(monkeypatch, ex, module, name, replacement):
    """module.<name> replaced, and the submission's own name for it (`from os import replace`)."""
    original = getattr(module, name)
    monkeypatch.setattr(module, name, replacement)
    if getattr(ex, name, None) is original:
        monkeypatch.setattr(ex, name, replacement)


class WatchedFiles:
    """Records every rename (os.replace, os.rename, and what calls them: shutil.move,
    Path.replace) and whether its source had been fsynced with all its bytes by then."""

    def __init__(self, monkeypatch, ex):
        self.renames = []   # (source, destination, synced)
        self.synced = set()  # (device, inode, size) of files at the moment they were fsynced
        for name, watch in [("replace", self.renaming), ("rename", self.renaming),
                            ("fsync", self.syncing), ("fdatasync", self.syncing)]:
            replace_everywhere(monkeypatch, ex, os, name, watch(getattr(os, name)))

    def renaming(self, real):
        def rename(source, destination, *args, **kwargs):
            try:
                facts = os.stat(source)
                synced = (facts.st_dev, facts.st_ino, facts.st_size) in self.synced
            except OSError:  # the rename itself will say what is wrong
                synced = False
            self.renames.append((os.path.realpath(source), os.path.realpath(destination),
                                 synced))
            return real(source, destination, *args, **kwargs)
        return rename

    def syncing(self, real):
        def sync(fd):
            facts = os.fstat(fd if isinstance(fd, int) else fd.fileno())
            self.synced.add((facts.st_dev, facts.st_ino, facts.st_size))
            return real(fd)
        return sync

    def arrivals(self, path):
        """(source, synced) of each rename that put a file at `path`."""
        return [(source, synced) for source, destination, synced in self.renames
                if destination == os.path.realpath(path)]


def two_saves(ex, monkeypatch, tmp_path):
    """save_snapshot into a new folder, then over that snapshot, watched: [renames onto the
    snapshot's name at each save]."""
    path = str(tmp_path / "run" / "snap.pt")
    arrivals = []
    for step in (1, 2):
        watched = WatchedFiles(monkeypatch, ex)
        ex.save_snapshot({"step": step, "weights": torch.zeros(1000)}, path)
        monkeypatch.undo()
        arrivals.append(watched.arrivals(path))
    return path, arrivals


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(3)
def test_saved_twice_the_newest_loads_and_the_one_before_is_kept(ex, tmp_path):
    """The first save goes into a folder that does not exist yet and has no snapshot to keep;
    the second keeps the first as .prev. With two whole snapshots, the loader takes the
    newest. The state holds NumPy's generator state, as the course's snapshots do."""
    path = str(tmp_path / "new" / "snap.pt")
    ex.save_snapshot(STATE, path)
    state, used = ex.load_snapshot(path)
    assert used == path and state["step"] == 12 and torch.equal(state["weights"], STATE["weights"])
    assert state["numpy_rng"][0] == "MT19937" and state["python_rng"] == STATE["python_rng"]
    ex.save_snapshot({"step": 13}, path)
    assert torch.load(path, weights_only=False)["step"] == 13
    assert torch.load(path + ".prev", weights_only=False)["step"] == 12
    state, used = ex.load_snapshot(path)
    assert used == path and state["step"] == 13, \
        f"two whole snapshots: loaded {used} (step {state['step']}), not the newest"


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(4)
def test_a_crash_while_writing_leaves_the_old_snapshot_whole(ex, tmp_path, monkeypatch):
    """torch.save dies half-way (the process killed, the disk full): `path` must still hold
    the complete previous snapshot, never the half-written one."""
    path = str(tmp_path / "snap.pt")
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

    replace_everywhere(monkeypatch, ex, torch, "save", dies_half_way)
    with pytest.raises(OSError):
        ex.save_snapshot({"step": 2, "weights": torch.zeros(1000)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False)["step"] == 1
    state, used = ex.load_snapshot(path)
    assert used == path and state["step"] == 1


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(2)
def test_the_new_snapshot_is_written_beside_it_and_renamed_into_place(ex, tmp_path, monkeypatch):
    """A rename is atomic only within one file system (across two it is a copy, or fails):
    the new snapshot must reach its name by a rename of a file in the same folder."""
    path, arrivals = two_saves(ex, monkeypatch, tmp_path)
    for save, arrived in enumerate(arrivals, 1):
        assert arrived, f"save {save}: nothing was renamed onto {path} (written in place?)"
        folders = {os.path.dirname(source) for source, _ in arrived}
        assert folders == {os.path.dirname(os.path.realpath(path))}, \
            f"save {save}: renamed onto the snapshot from {folders}, not from its own folder"


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(2)
def test_the_new_snapshot_is_on_the_disk_before_it_is_renamed(ex, tmp_path, monkeypatch):
    """write, flush, fsync, then rename: a rename of a file whose bytes are still only in
    memory can leave an empty snapshot under the name after a power cut."""
    path, arrivals = two_saves(ex, monkeypatch, tmp_path)
    for save, arrived in enumerate(arrivals, 1):
        assert arrived and all(synced for _, synced in arrived), \
            (f"save {save}: the file renamed onto {path} had not been fsynced with all its "
             f"bytes (os.fsync on its descriptor) before the rename")


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(2)
def test_a_damaged_snapshot_falls_back_to_the_one_before(ex, tmp_path):
    path = str(tmp_path / "snap.pt")
    ex.save_snapshot({"step": 1}, path)
    ex.save_snapshot({"step": 2}, path)
    data = open(path, "rb").read()
    with open(path, "wb") as f:  # truncated, as by a copy that stopped
        f.write(data[: len(data) // 3])
    state, used = ex.load_snapshot(path)
    assert used == path + ".prev" and state["step"] == 1
    with open(path, "wb") as f:  # garbage
        f.write(b"not a snapshot at all" * 10)
    state, used = ex.load_snapshot(path)
    assert used == path + ".prev" and state["step"] == 1


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(1)
def test_no_usable_snapshot_is_one_clear_error_naming_the_file(ex, tmp_path):
    path = str(tmp_path / "snap.pt")
    with open(path, "wb") as f:
        f.write(b"\x00" * 64)
    with pytest.raises(ex.SnapshotError) as raised:
        ex.load_snapshot(path)
    assert path in str(raised.value) and "\n" not in str(raised.value).strip()
    with pytest.raises(ex.SnapshotError, match="snap"):
        ex.load_snapshot(str(tmp_path / "missing" / "snap.pt"))


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(1)
def test_load_uses_map_location(ex, tmp_path):
    path = str(tmp_path / "snap.pt")
    ex.save_snapshot(STATE, path)
    seen = []

    def where(storage, location):
        seen.append(location)
        return storage

    state, _ = ex.load_snapshot(path, map_location=where)
    assert seen and torch.equal(state["weights"], STATE["weights"])
