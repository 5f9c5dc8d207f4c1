"""Lesson 6 experiment: a job told to stop saves at once; started again, it loses no step.

    make lesson6-preempt NPROC=2     # prints, then runs, this command:
    python scripts/experiments/lesson6_preempt_drill.py --nproc 2

1. The reference: scripts/lesson6_preemptible.py from beginning to end, never interrupted.
2. torchrun: the same run; at a random step this script sends SIGTERM to torchrun, as a
   scheduler or a person would. torchrun passes it to its workers and gives them 30 s; they
   finish the step, agree to stop, save a snapshot and exit. The same command, run again,
   resumes from that snapshot and trains to the end.
3. SLURM (root, slurm-wlm and munge; skipped, saying why, without them): lesson 5's cluster
   of separate hosts. scripts/lesson6_preempt.sbatch runs the training on 2 nodes; at a
   random step `scontrol requeue` stops it, as preemption does: SIGTERM to every process
   of the job, then the job back in the queue. SLURM starts it again by itself, and it
   resumes.
After each: the final weights against the reference's, bit for bit. Snapshots are written
only at the signal (--snapshot-every is larger than the run), so every step done before it
is kept: the resumed run's first step is the one after the stop.
"""

import os
import random
import re
import signal
import sys
import threading
import time
from pathlib import Path

from ddpcourse.cli import ArgumentParser
from ddpcourse.cluster import slurm
from ddpcourse.cluster.launch import LaunchError, launch
from ddpcourse.events import attempts_of, read_events
from ddpcourse.report import summary_line
from ddpcourse.scripts import import_script

same_weights = import_script("experiments/lesson6_kill_drill", "same_weights")  # bit for bit

ROOT = Path(__file__).resolve().parents[2]
STEP = "scripts/lesson6_preemptible.py"
SBATCH = "scripts/lesson6_preempt.sbatch"
NEVER = 10**6  # --snapshot-every: no periodic snapshot, only the one at the signal
REQUEUE_WAIT = 10  # seconds


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="processes of the torchrun job")
    parser.add_argument("--hosts", type=int, default=2,
                        help="SLURM nodes (one process each; their reference is run too)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=None, help="for the random steps")
    parser.add_argument("--parts", default="torchrun,slurm",
                        help="which drills, comma-separated: torchrun, slurm")
    parser.add_argument("--out", default="runs/lesson6_preempt", help="folder for the runs")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per run")
    args = parser.parse_args()
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if not args.parts or set(args.parts) - {"torchrun", "slurm"}:
        parser.error("--parts takes torchrun, slurm or both, comma-separated")
    if not 1 <= args.nproc <= 16 or not 1 <= args.hosts <= 8 or args.epochs < 2:
        parser.error("--nproc must be 1-16, --hosts 1-8 and --epochs at least 2")
    return args


def files(args, name):
    out = Path(args.out)
    return {"events": out / f"{name}_events.jsonl", "snapshot": out / f"{name}_snapshot.pt",
            "final": out / f"{name}_final.pt"}


def step_args(args, paths):
    return ["--epochs", str(args.epochs), "--snapshot-every", str(NEVER),
            "--snapshot", str(paths["snapshot"]), "--checkpoint", str(paths["final"]),
            "--events", str(paths["events"])]


def fresh(paths):
    for path in (*paths.values(), Path(f"{paths['snapshot']}.prev")):
        path.unlink(missing_ok=True)


# The same threads in every run: a sum split over more threads may round differently.
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def reference(args, world_size):
    paths = files(args, f"reference_w{world_size}")
    fresh(paths)
    print(f"== reference: {world_size} process(es), never interrupted", flush=True)
    result = launch(STEP, step_args(args, paths), nproc=world_size, timeout=args.timeout,
                    cwd=str(ROOT), env=ENV)
    if result.returncode != 0:
        sys.exit("error: the reference run failed (its output is above)")
    return paths


def when_reached(events, step, act, done):
    """Call act(event) once the event log shows `step` (any rank); stop when `done` is set."""
    while not done.is_set():
        reached = [e for e in read_events(events) if e["step"] >= step]
        if reached:
            act(reached[0])
            return
        time.sleep(0.02)


def pick_step(total, rng):
    """A step in the first half of the run: the signal lands a little later than asked."""
    return rng.randrange(2, max(3, total // 2))


def stopped_at(output):
    """The step after which the run said it stopped ('preempted: SIGTERM after step 17')."""
    found = re.findall(r"preempted: \S+ after step (\d+)", output)
    return int(found[-1]) if found else None


def judge(paths, ref, stop):
    """'yes' when the resumed run lost no step and its weights equal the reference's."""
    attempts = attempts_of([e for e in read_events(paths["events"]) if e["rank"] == 0])
    if len(attempts) < 2:
        sys.exit("error: the event log shows no second run after the stop")
    first_again = attempts[1][0]["step"]
    print(f"resume:  the second run's first step is {first_again}: "
          f"{stop + 1 - first_again} step(s) done twice, none lost")
    tensors, differing = same_weights(ref["final"], paths["final"])
    if differing:
        print(f"check: FAILED: {len(differing)} of {tensors} tensors differ, e.g. "
              f"{differing[0]}")
        return "no"
    print(f"check: the final weights are bit-identical to the reference's ({tensors} tensors)")
    return "yes" if first_again == stop + 1 else "no"


def torchrun_drill(args, ref, total, rng):
    paths = files(args, "torchrun")
    fresh(paths)
    ask = pick_step(total, rng)
    print(f"\n== torchrun: the same run; SIGTERM to torchrun when the job reaches step {ask}",
          flush=True)
    done = threading.Event()
    watcher = threading.Thread(target=when_reached, daemon=True, args=(
        paths["events"], ask, lambda e: os.kill(e["agent"], signal.SIGTERM), done))
    watcher.start()
    first = launch(STEP, step_args(args, paths), nproc=args.nproc, timeout=args.timeout,
                   cwd=str(ROOT), env=ENV, capture=True)
    done.set()
    sys.stdout.write(first.stdout[-1500:])
    stop = stopped_at(first.stdout)
    if stop is None:
        sys.exit("error: the run did not stop at the signal (its output is above)")
    print(f"stopped: after step {stop}; torchrun's exit status {first.returncode}\n"
          "== torchrun: the same command again", flush=True)
    again = launch(STEP, step_args(args, paths), nproc=args.nproc, timeout=args.timeout,
                   cwd=str(ROOT), env=ENV)
    if again.returncode != 0:
        sys.exit("error: the second run failed (its output is above)")
    return stop, judge(paths, ref, stop)


def slurm_drill(args, ref, total, rng):
    paths = files(args, "slurm")
    fresh(paths)
    ask = pick_step(total, rng)
    # SLURM's default KillWait: 30 s from SIGTERM to SIGKILL. A requeued job waits for its
    # last run's credentials to expire before it starts again: 120 s by default, 10 s here
    # (slurm.conf's AuthInfo=...,cred_expire=10).
    with slurm.Cluster(args.hosts, kill_wait=30, requeue_wait=REQUEUE_WAIT) as cluster:
        print(cluster.hosts.describe())
        print(cluster.describe(), flush=True)
        print(f"at step {ask}: scontrol requeue (as preemption does)", flush=True)
        requeued = {}

        def requeue(event):
            queued = cluster.run(["squeue", "--noheader", "--format=%i"]).stdout.split()
            if queued:
                said = cluster.run(["scontrol", "requeue", queued[0]])
                requeued.update(job=queued[0], status=said.returncode, time=time.time(),
                                said=(said.stdout + said.stderr).strip())

        done = threading.Event()
        watcher = threading.Thread(target=when_reached, daemon=True,
                                   args=(paths["events"], ask, requeue, done))
        watcher.start()
        job = cluster.sbatch(SBATCH, [STEP, *step_args(args, paths)], extra_env={
            "NPROC": "1", "OMP_NUM_THREADS": "1", "COURSE_VENV": str(ROOT / ".venv")},
            timeout=args.timeout, cwd=str(ROOT), echo=True)
        done.set()
    if requeued.get("status") != 0:
        sys.exit(f"error: scontrol requeue failed: {requeued.get('said', 'no job was running')}")
    stop = stopped_at(job.output)
    runs = len(re.findall(r"^job \d+: run \d+", job.output, re.M))
    print(f"\nstopped: after step {stop}; SLURM started job {requeued['job']} {runs} times; "
          f"its exit status at the end {job.returncode}")
    if job.returncode != 0 or stop is None or runs < 2:
        sys.exit("error: the job did not stop, requeue and finish (its output is above)")
    return stop, runs - 1, judge(paths, ref, stop)


def main():
    args = parse_args()
    started = time.perf_counter()
    rng = random.Random(args.seed)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    references = {}  # world size -> the uninterrupted run's files

    def reference_of(world_size):
        if world_size not in references:
            references[world_size] = reference(args, world_size)
        return references[world_size]

    results = {}
    if "torchrun" in args.parts:
        ref = reference_of(args.nproc)
        total = max(e["step"] for e in read_events(ref["events"]))
        stop, same = torchrun_drill(args, ref, total, rng)
        results.update(world_size=args.nproc, steps=total, torchrun_stopped_at_step=stop,
                       torchrun_bit_identical=same)
    why_not = slurm.unavailable_reason() if "slurm" in args.parts else "not asked for"
    if why_not:
        print(f"\n== SLURM: skipped ({why_not})")
        results["slurm"] = "skipped"
    else:
        print(f"\n== SLURM: {args.hosts} nodes of one process each", flush=True)
        ref = reference_of(args.hosts)
        total = max(e["step"] for e in read_events(ref["events"]))
        stop, requeues, same = slurm_drill(args, ref, total, rng)
        results.update(slurm_stopped_at_step=stop, slurm_requeued=requeues,
                       slurm_bit_identical=same)
    results["wall_s"] = round(time.perf_counter() - started, 1)
    print(summary_line(**results))
    return 0 if "no" not in results.values() else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (LaunchError, slurm.SlurmError) as error:
        sys.exit(f"error: {error}")
