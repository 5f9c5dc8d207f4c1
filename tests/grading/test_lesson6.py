"""Grading tests for lesson 6. resume_indices is compared with DistributedSampler itself and
with a resumed epoch's arithmetic; capture_state/restore_state are graded by a real kill
under torchrun (bit-identical or no points); save_snapshot/load_snapshot by crashes, damaged
files and the previous snapshot."""

import hashlib
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from ddpcourse.cluster.launch import launch
from ddpcourse.course.hidden import drawn
from ddpcourse.course.jobs import (
    TORCHRUN_JOBS,
    WORKERS,
    allow_the_launch,
    brief,
    difference,
    graded,
    run_job,
    will_launch,
)
from ddpcourse.course.probes import snapshot_python_rng
from ddpcourse.exercises import ROOT

JOBS = TORCHRUN_JOBS[6]  # world size -> its job


@pytest.fixture(scope="module")
def ex():
    yield from graded(6)


def uncounted(got, want):
    """Which indices `got` lacks and which it has too many of, against `want` (any order)."""
    try:
        missing, extra = Counter(want) - Counter(got), Counter(got) - Counter(want)
        return (f"got {len(got)} indices, expected {len(want)}; missing "
                f"{brief(sorted(missing.elements()), 60)}, too many "
                f"{brief(sorted(extra.elements()), 60)}")
    except Exception:  # not a list of indices: show it as it is
        return f"got {brief(got)}"


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
                got = ex.resume_indices(n, 3, epoch, 0, rank, world)
                want = sampler_indices(n, 3, epoch, rank, world)
                assert got == want, (
                    f"resume_indices({n}, seed=3, epoch={epoch}, start=0, rank={rank}, "
                    f"world_size={world}) is not DistributedSampler's share from the start: "
                    f"{difference(got, want)}")


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
                    got = ex.resume_indices(n, 0, epoch, k * batch, rank, world)
                    assert got == full[k * per_rank:], (
                        f"resume_indices({n}, seed=0, epoch={epoch}, start={k * batch}, "
                        f"rank={rank}, world_size={world}), {k} x {batch} samples into the "
                        f"epoch, should be the rank's share without its first {k} x {per_rank}: "
                        f"{difference(got, full[k * per_rank:])}")


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
        assert sorted(rest) == sorted(order[start:] + order[:padding]), (
            f"resume_indices({n}, seed={seed}, epoch={epoch}, start={start}, rank, "
            f"world_size={world}) over ranks 0..{world - 1} together should hold the {n - start} "
            f"positions not yet trained and {padding} repeated as padding, each once: "
            f"{uncounted(rest, order[start:] + order[:padding])}")
        mine = ex.resume_indices(n, seed, epoch, start, 1 % world, world)
        want = order[start + 1 % world::world][:3]
        assert mine[:3] == want, (
            f"resume_indices({n}, seed={seed}, epoch={epoch}, start={start}, rank={1 % world}, "
            f"world_size={world}) begins {brief(mine[:3])}, expected {want}: rank r goes on "
            f"from position start + r of the epoch's order, every {world}th")


@pytest.mark.l6_resume_position
@pytest.mark.points(2)
def test_datasets_smaller_than_the_world_and_the_end_of_the_epoch(ex):
    """More ranks than samples: the padding repeats the order more than once (1 sample on 3
    ranks, 3 on 8); one rank alone; any start, up to and past the end of the padded order,
    where nothing is left; and three cases drawn at grading time (hidden.py)."""
    for n, world in [(1, 1), (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (2, 5), (3, 8), (5, 4)]:
        for epoch in (0, 3):
            order = padded_order(n, 5, epoch, world)
            for start in range(len(order) + 3):
                for rank in range(world):
                    got = ex.resume_indices(n, 5, epoch, start, rank, world)
                    want = order[start:][rank::world]
                    assert got == want, (
                        f"resume_indices({n}, seed=5, epoch={epoch}, start={start}, rank={rank}, "
                        f"world_size={world}), the padded order {brief(order, 60)}: "
                        f"{difference(got, want)}")
    hidden = drawn("resume_position")  # and three cases drawn at grading time (hidden.py)
    for _ in range(3):
        n, world, seed, epoch = (hidden.randint(1, 6), hidden.randint(1, 9),
                                 hidden.randint(0, 99), hidden.randint(0, 9))
        order = padded_order(n, seed, epoch, world)
        start = hidden.randint(0, len(order) + 2)
        for rank in range(world):
            got = ex.resume_indices(n, seed, epoch, start, rank, world)
            want = order[start:][rank::world]
            assert got == want, (
                f"resume_indices({n}, seed={seed}, epoch={epoch}, start={start}, rank={rank}, "
                f"world_size={world}): {difference(got, want)}")


@pytest.mark.l6_resume_position
@pytest.mark.points(2)
def test_torchs_global_generator_is_left_alone(ex):
    """The training's dropout draws from torch's global generator: working out the positions
    must neither reseed it nor draw from it (the numbers it gives next stay the same)."""
    seeded = torch.Generator().manual_seed(1234).get_state()  # as torch.manual_seed(1234) leaves it
    for n, world, epoch, rank in [(10, 3, 1, 2), (7, 2, 4, 0), (1, 1, 0, 0)]:
        mine, after = ex.probe("global_generator_after", 1234, n, 11, epoch, 0, rank, world)
        want = sampler_indices(n, 11, epoch, rank, world)
        assert mine == want, (f"resume_indices({n}, seed=11, epoch={epoch}, start=0, rank={rank}, "
                              f"world_size={world}) is not DistributedSampler's share: "
                              f"{difference(mine, want)}")
        assert isinstance(after, torch.Tensor) and after.shape == seeded.shape and \
            torch.equal(after, seeded), \
            "resume_indices changed the state of torch's global random generator"


# --- l6_snapshot_state -------------------------------------------------------------------

def kill_and_resume(ex, world):
    """The kill-and-resume job at `world` ranks (workers/lesson6_resume.py) must report a
    bit-identical end. Before a launch the two functions are called once here, so that an
    unfinished exercise fails at once."""
    if will_launch(JOBS[world]):
        with ex.world_of_one():
            ex.probe("capture_and_restore_once")
    # a fresh folder the submission's ranks may write, made in its sandbox
    result = run_job(JOBS[world], script_args=["--work", "@workdir"])
    observed = getattr(result, "observations", None)
    assert isinstance(observed, dict) and isinstance(observed.get("resume"), dict), \
        "the job left no observations:\n" + (result.stdout + result.stderr)[-3000:]
    observed = observed["resume"]
    assert "problem" not in observed, f"resume: {observed['problem']}"
    reference, resumed = reference_state(world), observed.get("resumed")
    assert isinstance(resumed, dict) and set(resumed) == set(reference), \
        "the resumed run's final state has not the model's weights and buffers"
    differing = [k for k in reference if not (isinstance(resumed[k], torch.Tensor) and
                                              resumed[k].shape == reference[k].shape and
                                              torch.equal(reference[k], resumed[k]))]
    assert not differing, (
        f"after the kill the final weights and buffers differ from the run that never stopped "
        f"({len(differing)} of {len(reference)} tensors, {', '.join(differing[:4])}): "
        "something that shapes training was not captured or restored")


def reference_state(world):
    """The final weights and buffers of the run that never stops, trained by the grader
    itself (workers/lesson6_resume.py --reference-only, no submission in it, outside every
    sandbox); kept per world size and worker in the checkout's build/cache, which no sandbox
    sees."""
    worker = WORKERS / "lesson6_resume.py"
    key = hashlib.sha256(worker.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    cached = ROOT / "build" / "cache" / f"lesson6-reference-W{world}-{key}.pt"
    if not cached.exists():
        with tempfile.TemporaryDirectory() as work:
            allow_the_launch(240)
            done = launch(str(worker), ["--work", work, "--reference-only"], nproc=world,
                          timeout=180, capture=True, echo=False, cwd=str(ROOT))
            assert done.returncode == 0, (
                f"the grader's own reference run (no submission in it) ended with exit status "
                f"{done.returncode}:\n" + (done.stdout + done.stderr)[-3000:])
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(f".{os.getpid()}.tmp")
            shutil.copyfile(Path(work) / "reference_final.pt", partial)
            partial.replace(cached)
    return torch.load(cached, weights_only=True)


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

def arrivals(path, events):
    """(source, synced) of each rename, among a save's renames and fsyncs in order (probes.py's
    WatchedFiles), that put a file at `path`: synced when that file, all its bytes (the same
    device, inode and size), had been fsynced before the rename."""
    fsynced, found = [], []
    for event in events:
        if "fsync" in event:
            fsynced.append(event["fsync"])
        elif event["rename"][1] == path:
            found.append((event["rename"][0], event["file"] is not None and
                          event["file"] in fsynced))
    return found


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(3)
def test_saved_twice_the_newest_loads_and_the_one_before_is_kept(ex):
    """The first save goes into a folder that does not exist yet and has no snapshot to keep;
    the second keeps the first as .prev. With two whole snapshots, the loader takes the
    newest. The state holds NumPy's generator state, as the course's snapshots do."""
    seen = ex.probe("saved_twice")
    path, first, second = seen["path"], seen["first"], seen["second"]
    assert first["used"] == path and first["step"] == 12, (
        f"save_snapshot(a state at step 12, path) into a folder not made yet, then "
        f"load_snapshot(path): it loaded {first['used']!r} at step {first['step']!r}, expected "
        f"{path!r} at step 12")
    assert torch.equal(first["weights"], torch.arange(6.0)), (
        f"saved then loaded, the state's weights are {brief(first['weights'])}, expected "
        "tensor([0., 1., 2., 3., 4., 5.]), the weights saved")
    assert first["numpy_rng_kind"] == "MT19937" and first["python_rng"] == snapshot_python_rng(), (
        f"saved then loaded, the generator states are not the ones saved: NumPy's is of kind "
        f"{brief(first['numpy_rng_kind'], 40)} (expected 'MT19937'), Python's "
        f"{'is' if first['python_rng'] == snapshot_python_rng() else 'is not'} the one saved")
    assert seen["on_disk"] == 13 and seen["prev_on_disk"] == 12, (
        f"after saving step 12 and then step 13 at the same path, the file holds step "
        f"{seen['on_disk']!r} and path + '.prev' step {seen['prev_on_disk']!r}, expected 13 and "
        "12: the second save keeps the first as .prev")
    assert second["used"] == path and second["step"] == 13, \
        f"two whole snapshots: loaded {second['used']} (step {second['step']}), not the newest"


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(4)
def test_a_crash_while_writing_leaves_the_old_snapshot_whole(ex):
    """torch.save dies half-way (the process killed, the disk full): `path` must still hold
    the complete previous snapshot, never the half-written one."""
    seen = ex.probe("crash_while_writing")
    assert seen["raised"] is not None, "save_snapshot swallowed the error of torch.save"
    assert seen["on_disk"] == 1, (
        f"torch.save died half-way through a save of step 2 over a snapshot of step 1; the file "
        f"at the path then holds step {seen['on_disk']!r}, expected 1, the old snapshot whole: "
        "write the new one to another file, then rename it into place")
    assert seen["loaded"]["used"] == seen["path"] and seen["loaded"]["step"] == 1, (
        f"after that crashed save, load_snapshot(path) loaded {seen['loaded']['used']!r} at step "
        f"{seen['loaded']['step']!r}, expected {seen['path']!r} at step 1, the old snapshot")


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(2)
def test_the_new_snapshot_is_written_beside_it_and_renamed_into_place(ex):
    """A rename is atomic only within one file system (across two it is a copy, or fails):
    the new snapshot must reach its name by a rename of a file in the same folder."""
    path, saves = ex.probe("two_saves")
    for save, (target, events) in enumerate(saves, 1):
        arrived = arrivals(target, events)
        assert arrived, f"save {save}: nothing was renamed onto {path} (written in place?)"
        folders = {os.path.dirname(source) for source, _ in arrived}
        assert folders == {os.path.dirname(path)}, \
            f"save {save}: renamed onto the snapshot from {folders}, not from its own folder"


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(2)
def test_the_new_snapshot_is_on_the_disk_before_it_is_renamed(ex):
    """write, flush, fsync, then rename: a rename of a file whose bytes are still only in
    memory can leave an empty snapshot under the name after a power cut."""
    path, saves = ex.probe("two_saves")
    for save, (target, events) in enumerate(saves, 1):
        arrived = arrivals(target, events)
        assert arrived and all(synced is True for _, synced in arrived), \
            (f"save {save}: the file renamed onto {path} had not been fsynced with all its "
             f"bytes (os.fsync on its descriptor) before the rename")


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(2)
def test_a_damaged_snapshot_falls_back_to_the_one_before(ex):
    seen = ex.probe("damaged")
    for damage in ("truncated", "garbage"):
        assert seen[damage]["used"] == seen["path"] + ".prev", (
            f"load_snapshot(path) with a {damage} file at path and a whole one at path + '.prev' "
            f"used {seen[damage]['used']!r}, expected {seen['path'] + '.prev'!r}: fall back to "
            "the snapshot before")
        assert seen[damage]["step"] == 1, (
            f"load_snapshot(path) with a {damage} file at path loaded step "
            f"{seen[damage]['step']!r}, expected step 1, the snapshot at path + '.prev'")


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(1)
def test_no_usable_snapshot_is_one_clear_error_naming_the_file(ex):
    with pytest.raises(ex.SnapshotError) as raised:
        ex.probe("no_usable_snapshot", False)
    message = str(raised.value)
    assert "<path:snap.pt>" in message and "\n" not in message.strip(), (
        f"load_snapshot of a file of zeros with no .prev raised SnapshotError({message!r}), "
        "expected one line that names the file's path")
    with pytest.raises(ex.SnapshotError, match="snap"):
        ex.probe("no_usable_snapshot", True)


@pytest.mark.l6_atomic_snapshot
@pytest.mark.points(1)
def test_load_uses_map_location(ex):
    locations, weights = ex.probe("map_location_used")
    assert len(locations) > 0, "load_snapshot did not pass map_location to torch.load"
    assert torch.equal(weights, torch.arange(6.0)), (
        f"load_snapshot(path, map_location=<a function>) returned the weights "
        f"{brief(weights)}, expected tensor([0., 1., 2., 3., 4., 5.]), the weights saved")
