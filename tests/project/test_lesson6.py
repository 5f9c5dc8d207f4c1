"""Lesson 6 run for real: a worker killed mid-run resumes to bit-identical weights at W = 1, 2
and 3; an elastic job shrinks and grows; uneven data hangs without Join and finishes with it;
a stuck rank is found from the stacks and the flight recorder; damaged or foreign snapshots
give one line."""

import re

import pytest
import torch
from util import PYTHON, run, share_of_lines_kept

from ddpcourse.cluster.launch import launch


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_killed_worker_resumes_to_bit_identical_weights(world, tmp_path):
    result = run([PYTHON, "scripts/lesson6_kill_drill.py", "--nproc", str(world), "--epochs",
                  "2", "--seed", str(world), "--out", str(tmp_path)], timeout=280)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-3000:]
    kill = re.search(r"^kill: +step (\d+), rank (\d+) \(pid (\d+)\), SIGKILL$", out, re.M)
    resume = re.search(r"^resume: +from step (\d+) \(epoch \d, \d+ of its samples done\): "
                       r"(\d+) step\(s\) done again", out, re.M)
    assert kill and resume, out[-3000:]
    assert int(resume.group(1)) + int(resume.group(2)) == int(kill.group(1))
    assert int(resume.group(1)) % 4 == 0 or int(resume.group(1)) % 6 == 0  # a snapshot step
    assert f"bit-identical to the reference's (92 tensors, world size {world})" in out
    assert "--max-restarts=3" in out and re.search(r"^snapshots: \d+, \d+ ms each", out, re.M)
    # The drill's own claim, checked again here from its files.
    ref, drilled = (torch.load(tmp_path / f"{n}_final.pt", weights_only=False)["model"]
                    for n in ("reference", "drill"))
    assert all(torch.equal(ref[k], drilled[k]) for k in ref)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_elastic_job_shrinks_when_a_node_is_lost_and_grows_when_it_returns(tmp_path):
    result = run([PYTHON, "scripts/lesson6_elastic_drill.py", "--nproc", "1", "--epochs", "20",
                  "--out", str(tmp_path)], timeout=280)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-4000:]
    sizes = re.search(r"^world size by step: (.+)$", out, re.M).group(1)
    assert [int(w) for w in re.findall(r"(\d+) for steps", sizes)] == [2, 1, 2], sizes
    assert re.search(r"^shrink: [\d.]+ s .* at world size 1, from step \d+$", out, re.M)
    assert re.search(r"^grow: +[\d.]+ s .* at world size 2, from step \d+$", out, re.M)
    assert (tmp_path / "final.pt").exists()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_uneven_batches_hang_until_the_timeout_and_join_fixes_them():
    # The same jobs as notebooks/lesson6.ipynb's, so the job cache runs each once.
    hang = launch("scripts/lesson6_uneven.py", ["--timeout", "5"], nproc=3, timeout=120,
                  capture=True, backend="gloo")
    assert hang.returncode != 0 and "Timed out waiting 5000ms" in hang.stderr, hang.stderr[-2000:]
    joined = launch("scripts/lesson6_uneven.py", ["--join"], nproc=3, timeout=120,
                    capture=True, backend="gloo")
    assert joined.returncode == 0, joined.stderr[-2000:]
    for rank, own, shadowed in [(0, 20, 2), (1, 21, 1), (2, 22, 0)]:
        assert f"rank {rank}: {own} batches of its own, {shadowed} shadowed all-reduce(s)" \
            in joined.stdout
    assert "weights_equal_on_all_ranks=True" in joined.stdout


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_stuck_rank_shows_in_the_stacks_and_the_flight_recorder():
    result = launch("scripts/lesson6_stuck.py", [], nproc=3, timeout=120, capture=True,
                    backend="gloo")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "rank 1 flight recorder: #1 gloo:all_reduce, #2 gloo:all_reduce, #3 gloo:all_reduce" \
        in out
    for rank in (0, 2):
        assert f"rank {rank} flight recorder: #2 gloo:all_reduce, #3 gloo:all_reduce, " \
               "#4 gloo:all_reduce" in out
    stacks = out.split("Timeout (0:00:0")[1:]
    assert len(stacks) == 3, out[-3000:]
    assert sum("in all_reduce" in s.split("Timeout")[0] for s in stacks) == 2
    assert "lesson6_stuck.py" in stacks[1]


def resumable(tmp_path, *args):
    """A world of one, without torchrun (which the script notes in a line of its own)."""
    result = run([PYTHON, "scripts/lesson6_resumable.py", "--snapshot", str(tmp_path / "s.pt"),
                  "--checkpoint", str(tmp_path / "final.pt"), *args], timeout=200)
    result.stderr = "".join(line for line in result.stderr.splitlines(keepends=True)
                            if not line.startswith("note: not started by torchrun"))
    return result


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_damaged_and_foreign_snapshots_give_one_line_and_the_previous_one_is_used(tmp_path):
    first = resumable(tmp_path, "--epochs", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    snapshot, previous = tmp_path / "s.pt", tmp_path / "s.pt.prev"
    assert snapshot.exists() and previous.exists()

    whole = snapshot.read_bytes()
    snapshot.write_bytes(whole[: len(whole) // 2])  # truncated: the one before is used
    again = resumable(tmp_path, "--epochs", "1")
    assert again.returncode == 0, again.stderr[-2000:]
    assert re.search(rf"^warning: {re.escape(str(snapshot))} is unreadable \(.+\); using "
                     rf"{re.escape(str(previous))}$", again.stdout, re.M), again.stdout

    for damaged in (snapshot, previous):
        damaged.write_bytes(b"\x00" * 100)
    broken = resumable(tmp_path, "--epochs", "1")
    error = broken.stderr.strip().splitlines()
    assert broken.returncode == 1 and len(error) == 1, broken.stderr[-2000:]
    assert error[0].startswith(f"error: {snapshot} is unreadable") and str(previous) in error[0]
    assert error[0].endswith("(remove it, or start over with --fresh)")

    fresh = resumable(tmp_path, "--epochs", "1", "--fresh")
    assert fresh.returncode == 0 and "resume:" not in fresh.stdout
    foreign = resumable(tmp_path, "--epochs", "1", "--model", "resnet10t")
    error = foreign.stderr.strip().splitlines()
    assert foreign.returncode == 1 and len(error) == 1, foreign.stderr[-2000:]
    assert f"{snapshot} belongs to another run: model_name 'test_resnet', not 'resnet10t'" \
        in error[0]


def test_the_resumable_script_is_lesson_3_plus_its_lesson():
    """`diff lesson3_ddp.py lesson6_resumable.py` teaches: lesson 3's lines are all there."""
    assert share_of_lines_kept("lesson3_ddp.py", "lesson6_resumable.py") > 0.8
