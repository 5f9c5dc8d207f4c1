"""Lesson 6 experiment: a worker killed mid-run; torchrun restarts the job; it resumes, bit-exact.

    make lesson6-kill NPROC=3        # prints, then runs, this command:
    python scripts/experiments/lesson6_kill_drill.py --nproc 3

1. The reference: scripts/lesson6_resumable.py (the lesson's step, launched as it is) from the
   beginning to the end, never interrupted.
2. The drill: the same run under `torchrun --max-restarts=3`. When the job reaches a random
   step, this script sends SIGKILL to one worker, chosen at random: the way a process dies
   when the machine runs out of memory, with no chance to save anything.
3. torchrun sees the dead worker, stops the others and starts them all again; they resume
   from the last snapshot and train to the end.
4. The check: the drill's final weights against the reference's, bit for bit. Then the time
   one snapshot of this run takes to write (the exercise's save_snapshot, timed here).

The run's own event log (--events: one JSON line per step and rank, with the worker's pid)
tells the drill whom to kill and when, and gives the timeline: printed here, and drawn in
runs/lesson6_timeline.png.
"""

import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from ddpcourse.cli import ArgumentParser
from ddpcourse.cluster.launch import LaunchError, launch
from ddpcourse.events import attempts_of, read_events

ROOT = Path(__file__).resolve().parents[2]
STEP = "scripts/lesson6_resumable.py"


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="processes of the job")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--snapshot-every", type=int, default=4)
    parser.add_argument("--kill-step", type=int, default=None,
                        help="the step at which a worker dies (default: a random one)")
    parser.add_argument("--seed", type=int, default=None, help="for the random choices")
    parser.add_argument("--out", default="runs/lesson6_drill", help="folder for the runs' files")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    args = parser.parse_args()
    if not 1 <= args.nproc <= 16 or args.epochs < 1 or args.snapshot_every < 1:
        parser.error("--nproc must be 1-16, --epochs and --snapshot-every >= 1")
    return args


def kill_when_reached(events_path, step, rank, done, report):
    """Watch the event log; at `step`, SIGKILL the worker of `rank` (its pid is logged)."""
    while not done.is_set():
        for event in read_events(events_path):
            if event["step"] == step and event["rank"] == rank:
                os.kill(event["pid"], signal.SIGKILL)
                report.update(event, killed_at=time.time())
                return
        time.sleep(0.02)


def run(args, name, torchrun_args=None):
    out = Path(args.out)
    events = out / f"{name}_events.jsonl"
    snapshot = out / f"{name}_snapshot.pt"
    for old in (events, snapshot, Path(f"{snapshot}.prev")):  # not --fresh: the restarted
        old.unlink(missing_ok=True)                             # workers must find the snapshot
    step_args = ["--epochs", str(args.epochs), "--snapshot-every", str(args.snapshot_every),
                 "--snapshot", str(snapshot),
                 "--checkpoint", str(out / f"{name}_final.pt"), "--events", str(events)]
    # c10d rendezvous, and workers that do not share its store: torchrun's restarts fail
    # without both in this torch (stale addresses from the dead attempt; see the reading).
    env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return events, out / f"{name}_final.pt", snapshot, lambda: launch(
        STEP, step_args, nproc=args.nproc, timeout=args.timeout, cwd=str(ROOT), env=env,
        torchrun_args=torchrun_args, rdzv="c10d")


def same_weights(a, b):
    import torch

    left, right = (torch.load(p, map_location="cpu", weights_only=True)["model"] for p in (a, b))
    differing = [k for k in left if not torch.equal(left[k], right[k])]
    return len(left), differing


def time_a_snapshot(snapshot, repeats=5):
    """(median seconds, megabytes): the exercise's save_snapshot writing this run's snapshot
    again, into a folder of its own (the state as capture_state made it, read back)."""
    import torch

    from ddpcourse.exercises import exercises_for_a_script

    exercises, _ = exercises_for_a_script(6)
    # Our own file, written by the run above: NumPy's generator state in it needs the full
    # unpickler (weights_only=False), which would run any code a stranger's file holds.
    state = torch.load(snapshot, map_location="cpu", weights_only=False)
    with tempfile.TemporaryDirectory(dir=Path(snapshot).parent) as folder:
        path = os.path.join(folder, "timed.pt")
        seconds = []
        for _ in range(repeats):
            tick = time.perf_counter()
            exercises.save_snapshot(state, path)
            seconds.append(time.perf_counter() - tick)
        return statistics.median(seconds), os.path.getsize(path) / 1e6


def main():
    args = parse_args()
    rng = random.Random(args.seed)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print("== 1. reference: never interrupted", flush=True)
    reference_events, reference, _, start = run(args, "reference")
    if start().returncode != 0:
        sys.exit("error: the reference run failed (its output is above)")
    total = max(e["step"] for e in read_events(reference_events))  # the run's steps, counted
    if args.kill_step is not None and not 1 <= args.kill_step < total:
        sys.exit(f"error: --kill-step must be between 1 and {total - 1} (the run has {total})")
    # By default after the first snapshot, so that there is one to resume from, and between
    # two snapshots, so that some steps are lost (at a snapshot's step, whether it was
    # written before the kill is a race).
    between = [s for s in range(args.snapshot_every + 1, total) if s % args.snapshot_every]
    kill_step = args.kill_step or rng.choice(between or [total - 1])
    victim = rng.randrange(args.nproc)

    print(f"\n== 2. drill: the same {total} steps; at step {kill_step}, SIGKILL to rank "
          f"{victim}'s worker\n(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is set for it: see the "
          "reading)", flush=True)
    events, drilled, snapshot, start = run(args, "drill", torchrun_args=["--max-restarts=3"])
    done, report = threading.Event(), {}
    watcher = threading.Thread(target=kill_when_reached,
                               args=(events, kill_step, victim, done, report), daemon=True)
    watcher.start()
    result = start()
    done.set()
    if result.returncode != 0:
        sys.exit("error: the drill run did not finish after the kill (its output is above)")
    if not report:
        sys.exit(f"error: the run never reached step {kill_step}; nothing was killed")

    print("\n== 3. what happened, from the run's own event log", flush=True)
    log = [e for e in read_events(events) if e["rank"] == 0]
    attempts = attempts_of(log)
    print(f"kill:    step {kill_step}, rank {victim} (pid {report['pid']}), SIGKILL")
    if len(attempts) < 2:
        sys.exit("error: the event log shows no second attempt after the kill")
    resumed = attempts[1][0]  # rank 0's first step after the restart
    # The last step any rank logged before the kill: rank 0 may not have logged the step the
    # victim had just finished when torchrun stopped it.
    reached = max((e for e in read_events(events) if e["time"] < resumed["time"]),
                  key=lambda e: e["step"])
    print(f"restart: torchrun stopped the job's workers and started {args.nproc} new one(s); "
          f"{resumed['time'] - report['killed_at']:.1f} s from the kill to the first step "
          "after the resume")
    print(f"resume:  from step {resumed['step'] - 1}: {reached['step'] - resumed['step'] + 1} "
          f"step(s) done again (the job had reached step {reached['step']}), nothing else lost")
    tensors, differing = same_weights(reference, drilled)
    if differing:
        sys.exit(f"check: FAILED: {len(differing)} of {tensors} tensors differ from the "
                 f"reference, e.g. {differing[0]}")
    print(f"check: the final weights are bit-identical to the reference's ({tensors} tensors, "
          f"world size {args.nproc})")
    seconds, megabytes = time_a_snapshot(snapshot)
    steps = [b["time"] - a["time"] for a, b in zip(attempts[-1], attempts[-1][1:], strict=False)]
    print(f"snapshot: {seconds * 1000:.0f} ms to write {megabytes:.1f} MB (median of 5); a step "
          f"takes {statistics.median(steps) * 1000:.0f} ms here (median)")
    record = {"events": log, "kill": report, "snapshot_every": args.snapshot_every,
              "steps_per_epoch": total // args.epochs}
    with open(Path(args.out) / "drill_record.json", "w") as f:  # what the picture is drawn from
        json.dump(record, f)
    try:
        from ddpcourse.figures.failures import draw_timeline

        picture = draw_timeline(record, "runs/lesson6_timeline.png")
        print(f"picture of this drill: {picture}")
    except ImportError:  # matplotlib missing: the numbers above are the result
        pass


if __name__ == "__main__":
    try:
        main()
    except LaunchError as error:
        sys.exit(f"error: {error}")
