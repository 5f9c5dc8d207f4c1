"""Grading tests for lesson 6. resume_indices is compared with DistributedSampler itself and
with a resumed epoch's arithmetic; capture_state/restore_state are graded by a real kill
under torchrun (bit-identical or no points); save_snapshot/load_snapshot by crashes, damaged
files and the previous snapshot."""

import tempfile

import pytest
import torch
from jobs import Job, run_job
from torch.utils.data import DistributedSampler

from ddpcourse.grading import load_exercises

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

@pytest.mark.l6_resume_position
@pytest.mark.points(2)
def test_from_the_start_it_is_distributed_samplers_split(ex):
    for n, world in [(10, 1), (10, 3), (11, 4), (1438, 3), (7, 2), (3, 4)]:
        for epoch in (0, 1, 5):
            for rank in range(world):
                assert ex.resume_indices(n, 3, epoch, 0, rank, world) == \
                    sampler_indices(n, 3, epoch, rank, world), (n, world, epoch, rank)


@pytest.mark.l6_resume_position
@pytest.mark.points(3)
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
@pytest.mark.points(3)
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


# --- l6_snapshot_state -------------------------------------------------------------------

def kill_and_resume(world):
    work = tempfile.mkdtemp(prefix=f"lesson6-resume-W{world}-")
    result = run_job(JOBS[world], script_args=["--work", work])
    lines = [line for line in result.stdout.splitlines() if line.startswith("resume: ")]
    assert lines == [f"resume: ok, bit-identical at {world} ranks"], \
        (result.stdout + result.stderr)[-3000:]


@pytest.mark.l6_snapshot_state
@pytest.mark.points(3)
def test_killed_and_restarted_one_rank_ends_bit_identical(ex):
    kill_and_resume(1)


@pytest.mark.l6_snapshot_state
@pytest.mark.points(3)
def test_killed_and_restarted_two_ranks_end_bit_identical(ex):
    kill_and_resume(2)


@pytest.mark.l6_snapshot_state
@pytest.mark.points(3)
def test_killed_and_restarted_three_ranks_end_bit_identical(ex):
    kill_and_resume(3)


# --- l6_atomic_snapshot ------------------------------------------------------------------

STATE = {"weights": torch.arange(6.0), "step": 12}


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(1)
def test_a_snapshot_round_trips_into_a_new_folder(ex, tmp_path):
    path = str(tmp_path / "new" / "snap.pt")
    ex.save_snapshot(STATE, path)
    state, used = ex.load_snapshot(path)
    assert used == path and state["step"] == 12 and torch.equal(state["weights"], STATE["weights"])


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(2)
def test_the_snapshot_before_is_kept_as_prev(ex, tmp_path):
    path = str(tmp_path / "snap.pt")
    ex.save_snapshot({"step": 1}, path)
    ex.save_snapshot({"step": 2}, path)
    assert torch.load(path, weights_only=False)["step"] == 2
    assert torch.load(path + ".prev", weights_only=False)["step"] == 1


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(3)
def test_a_crash_while_writing_leaves_the_old_snapshot_whole(ex, tmp_path, monkeypatch):
    """torch.save dies half-way (the process killed, the disk full): `path` must still hold
    the complete previous snapshot, never the half-written one."""
    path = str(tmp_path / "snap.pt")
    ex.save_snapshot({"step": 1}, path)
    real_save = torch.save

    def dies_half_way(obj, f, *args, **kwargs):
        import io

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

    monkeypatch.setattr(torch, "save", dies_half_way)
    if hasattr(ex, "save"):  # `from torch import save`
        monkeypatch.setattr(ex, "save", dies_half_way)
    with pytest.raises(OSError):
        ex.save_snapshot({"step": 2, "weights": torch.zeros(1000)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False)["step"] == 1
    state, used = ex.load_snapshot(path)
    assert used == path and state["step"] == 1


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
