"""Lesson 6 run for real: the step (scripts/lesson6_resumable.py) resumes a killed worker to
bit-identical weights at W = 1 and 3 (W = 2 in the notebook); an elastic job shrinks and grows;
uneven data hangs without Join and finishes with it, dividing by the initial world size unless
told otherwise; a stuck rank is found from the stacks and the flight recorder; damaged or
foreign snapshots, and exercises still stubs, give one line."""

import os
import re

import pytest
import torch
from util import PYTHON, ROOT, run, share_of_lines_kept

from ddpcourse.cluster import slurm
from ddpcourse.cluster.launch import launch
from ddpcourse.events import attempts_of, read_events
from ddpcourse.report import parse_summary

EXPERIMENTS = "scripts/experiments"
NO_SLURM = slurm.unavailable_reason()
needs_slurm = pytest.mark.skipif(NO_SLURM is not None, reason=f"no SLURM cluster here: {NO_SLURM}")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 3])
def test_a_killed_worker_resumes_to_bit_identical_weights(world, tmp_path):
    result = run([PYTHON, f"{EXPERIMENTS}/lesson6_kill_drill.py", "--nproc", str(world),
                  "--epochs", "2", "--seed", str(world), "--out", str(tmp_path)], timeout=280)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-3000:]
    kill = re.search(r"^kill: +step (\d+), rank (\d+) \(pid (\d+)\), SIGKILL$", out, re.M)
    resume = re.search(r"^resume: +from step (\d+): (\d+) step\(s\) done again \(the job "
                       r"had reached step (\d+)\)", out, re.M)
    assert kill and resume, out[-3000:]
    since, again, reached = (int(n) for n in resume.groups())
    assert since + again == reached >= int(kill.group(1)) and since % 4 == 0  # a snapshot's step
    assert f"bit-identical to the reference's (92 tensors, world size {world})" in out
    assert "--max-restarts=3" in out and "scripts/lesson6_resumable.py" in out
    assert re.search(r"^snapshot: \d+ ms to write 3\.\d MB \(median of 5\); a step takes \d+ ms",
                     out, re.M), out[-2000:]
    # The drill's own claim, checked again here from its files.
    ref, drilled = (torch.load(tmp_path / f"{n}_final.pt", weights_only=True)["model"]
                    for n in ("reference", "drill"))
    assert all(torch.equal(ref[k], drilled[k]) for k in ref)


@pytest.mark.slow
@pytest.mark.drills  # a minute of restarts: make test-drills
@pytest.mark.timeout(300)
def test_an_elastic_job_shrinks_when_a_node_is_lost_and_grows_when_it_returns(tmp_path):
    result = run([PYTHON, f"{EXPERIMENTS}/lesson6_elastic_drill.py", "--nproc", "1",
                  "--epochs", "20", "--out", str(tmp_path)], timeout=280)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-4000:]
    sizes = re.search(r"^world size by step: (.+)$", out, re.M).group(1)
    assert [int(w) for w in re.findall(r"(\d+) for steps", sizes)] == [2, 1, 2], sizes
    shrink = re.search(r"^shrink: [\d.]+ s .* world size 1, resumed from step (\d+)$", out, re.M)
    grow = re.search(r"^grow: +[\d.]+ s .* world size 2, resumed from step (\d+)$", out, re.M)
    assert shrink and grow, out[-3000:]
    assert int(shrink.group(1)) % 3 == 0 and int(grow.group(1)) % 3 == 0  # snapshot steps
    assert (tmp_path / "final.pt").exists()


@pytest.mark.timeout(120)
def test_the_elastic_drill_stops_at_the_first_failed_worker_and_fits_its_nodes_to_the_gpus(
        tmp_path):
    # A machine with one GPU (an nvidia-smi that lists one), too few for two nodes of one
    # worker each; and node B's worker (rank 1) dies as it starts, as it did there when two
    # ranks shared the GPU. The drill must say where it runs, and stop at the failure, long
    # before its own --timeout.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    (fake / "nvidia-smi").chmod(0o755)
    (tmp_path / "sitecustomize.py").write_text(
        "import os\nif os.environ.get('RANK') == '1':\n    raise SystemExit('rank 1 dies')\n")
    # Real interpreters (no fork server): they read sitecustomize as they start.
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path),
           "COURSE_FORKSERVER_OFF": "1", "CUDA_VISIBLE_DEVICES": "0"}
    result = run([PYTHON, f"{EXPERIMENTS}/lesson6_elastic_drill.py", "--nproc", "1",
                  "--epochs", "20", "--out", str(tmp_path / "out"), "--timeout", "100"],
                 env=env, timeout=110)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    assert ("note: nodes A and B need 2 GPUs (1 each, one per worker) and this machine has 1: "
            "both run on the CPU with gloo instead") in result.stdout
    assert re.search(r"^error: a worker of node [AB] failed before step 5 at world size 2, "
                     r"where none should", result.stderr, re.M), result.stderr[-2000:]


def uneven(*args, timeout=120):
    return launch(f"{EXPERIMENTS}/lesson6_uneven.py", list(args), nproc=3, timeout=timeout,
                  capture=True, backend="gloo")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_uneven_batches_hang_until_the_timeout_and_join_fixes_them():
    # The same jobs as notebooks/lesson6.ipynb's, so the job cache runs each once.
    hang = uneven("--timeout", "5")
    # torch's words may change; the 5 s (5000 ms) this job set may not.
    assert hang.returncode != 0 and re.search(r"(?i)timed? ?out\b.*\b5000 ?ms\b", hang.stderr), \
        hang.stderr[-2000:]
    joined = uneven("--join")
    assert joined.returncode == 0, joined.stderr[-2000:]
    for rank, own, shadowed in [(0, 20, 2), (1, 21, 1), (2, 22, 0)]:
        assert f"rank {rank}: {own} batches of its own, {shadowed} shadowed step(s)" \
            in joined.stdout
    assert "weights_equal_on_all_ranks=True" in joined.stdout
    # The last step, where rank 2 alone has data: the sum is divided by the initial world
    # size (Join's default), or by the ranks that had data.
    assert "the only rank with data: DDP's gradient = its own / 3.00" in joined.stdout
    by_ranks = uneven("--join", "--divide-by-ranks-with-data")
    assert by_ranks.returncode == 0, by_ranks.stderr[-2000:]
    assert "the only rank with data: DDP's gradient = its own / 1.00" in by_ranks.stdout


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_stuck_rank_shows_in_the_stacks_and_the_flight_recorder():
    result = launch(f"{EXPERIMENTS}/lesson6_stuck.py", [], nproc=3, timeout=120, capture=True,
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


def resumable(tmp_path, *args, env=None):
    """The step as a world of one, without torchrun (which it notes in a line of its own)."""
    result = run([PYTHON, "scripts/lesson6_resumable.py", "--snapshot", str(tmp_path / "s.pt"),
                  "--checkpoint", str(tmp_path / "final.pt"), *args], timeout=200, env=env)
    result.stderr = "".join(line for line in result.stderr.splitlines(keepends=True)
                            if not line.startswith("note: not started by torchrun")
                            and "Warning: find_unused_parameters" not in line)
    return result


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_damaged_and_foreign_snapshots_give_one_line_and_the_previous_one_is_used(tmp_path):
    first = resumable(tmp_path, "--epochs", "1", "--snapshot-every", "2")
    assert first.returncode == 0, first.stderr[-2000:]
    snapshot, previous = tmp_path / "s.pt", tmp_path / "s.pt.prev"
    assert snapshot.exists() and previous.exists()

    whole = snapshot.read_bytes()
    snapshot.write_bytes(whole[: len(whole) // 2])  # truncated: the one before is used
    again = resumable(tmp_path, "--epochs", "1")
    assert again.returncode == 0, again.stderr[-2000:]
    assert re.search(rf"^resume: from {re.escape(str(previous))}: epoch 1, 512 of its samples "
                     r"done, step 2; 1 process\(es\) now$", again.stdout, re.M), again.stdout

    for damaged in (snapshot, previous):
        damaged.write_bytes(b"\x00" * 100)
    broken = resumable(tmp_path, "--epochs", "1")
    error = broken.stderr.strip().splitlines()
    assert broken.returncode == 1 and len(error) == 1, broken.stderr[-2000:]
    assert error[0].startswith("error: cannot resume: ") and str(previous) in error[0]
    assert error[0].endswith("(or start with --fresh)")

    fresh = resumable(tmp_path, "--epochs", "1", "--fresh")
    assert fresh.returncode == 0 and "resume:" not in fresh.stdout
    foreign = resumable(tmp_path, "--epochs", "1", "--model", "resnet10t")
    error = foreign.stderr.strip().splitlines()
    assert foreign.returncode == 1 and len(error) == 1, foreign.stderr[-2000:]
    assert "Error(s) in loading state_dict" in error[0]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_while_an_exercise_is_a_stub_the_step_says_so_in_one_line(tmp_path):
    # COURSE_SUBMISSION points the exercise loader at a folder: the course's own stubs.
    stubs = resumable(tmp_path, "--epochs", "1", env={"COURSE_SUBMISSION": str(ROOT)})
    error = stubs.stderr.strip().splitlines()
    assert stubs.returncode == 1 and len(error) == 1, stubs.stderr[-2000:]
    assert re.fullmatch(r"error: l6_\w+: .+: write it in lessons/lesson6/exercises\.py "
                        r"\(this script runs it\)", error[0]), error[0]


def test_the_resumable_script_is_lesson_3_plus_its_lesson():
    """`diff lesson3_ddp.py lesson6_resumable.py` teaches: lesson 3's lines are all there."""
    assert share_of_lines_kept("lesson3_ddp.py", "lesson6_resumable.py") > 0.8


# --- preempted: SIGTERM under torchrun, and a SLURM job requeued --------------------------

PREEMPT = f"{EXPERIMENTS}/lesson6_preempt_drill.py"


def preempt_drill(tmp_path, *args, timeout=240):
    result = run([PYTHON, PREEMPT, "--epochs", "4", "--out", str(tmp_path), *args],
                 timeout=timeout)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-4000:]
    summary = parse_summary(out)
    return out, summary


def resumed_without_loss(tmp_path, name, world, stopped):
    """From the drill's files: the run after the stop began at the step after it, and its
    final weights equal the uninterrupted run's, bit for bit."""
    ranks0 = [e for e in read_events(tmp_path / f"{name}_events.jsonl") if e["rank"] == 0]
    first_after = [attempt[0]["step"] for attempt in attempts_of(ranks0)[1:]]
    assert first_after == [stopped + 1], (first_after, stopped)
    ref, again = (torch.load(tmp_path / f"{n}_final.pt", weights_only=True)["model"]
                  for n in (f"reference_w{world}", name))
    assert ref.keys() == again.keys() and all(torch.equal(ref[k], again[k]) for k in ref)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_to_torchrun_saves_at_once_and_the_same_command_loses_no_step(tmp_path):
    out, summary = preempt_drill(tmp_path, "--nproc", "3", "--parts", "torchrun", "--seed", "5")
    stopped = int(summary["torchrun_stopped_at_step"])
    assert summary["torchrun_bit_identical"] == "yes" and summary["slurm"] == "skipped", summary
    assert 2 <= stopped < int(summary["steps"]) == 24, summary
    # Every rank agreed on the step; rank 0 saved it; torchrun reported the stop as a failure
    assert f"preempted: SIGTERM after step {stopped}; snapshot written" in out
    assert re.search(rf"^stopped: after step {stopped}; torchrun's exit status [1-9]", out, re.M)
    resumed_without_loss(tmp_path, "torchrun", 3, stopped)


@needs_slurm
@pytest.mark.slow
@pytest.mark.drills  # two minutes of a real SLURM requeue: make test-drills
@pytest.mark.timeout(300)
def test_a_slurm_job_requeued_mid_run_resumes_to_bit_identical_weights(tmp_path):
    out, summary = preempt_drill(tmp_path, "--hosts", "2", "--parts", "slurm", "--seed", "2",
                                 timeout=280)
    stopped = int(summary["slurm_stopped_at_step"])
    assert summary["slurm_requeued"] == "1" and summary["slurm_bit_identical"] == "yes", summary
    # SLURM itself stopped the job and started it again under the same number
    assert re.search(r"\*\*\* JOB (\d+) ON host0 CANCELLED AT \S+ DUE TO JOB REQUEUE \*\*\*",
                     out), out[-3000:]
    assert re.search(r"^job (\d+): run 1 on .*\n(?:.*\n)*?job \1: run 2 on ", out, re.M)
    resumed_without_loss(tmp_path, "slurm", 2, stopped)


def test_the_preempt_drill_refuses_unknown_parts_in_one_line():
    result = run([PYTHON, PREEMPT, "--parts", "torchrun,pbs"], timeout=60)
    assert result.returncode == 2 and "--parts takes torchrun, slurm" in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2, result.stderr
