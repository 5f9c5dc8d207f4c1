"""Lesson 6 drill: kill a worker mid-run; torchrun restarts the job; it resumes, losing nothing.

    make lesson6-kill NPROC=3        # prints, then runs, this command:
    python scripts/lesson6_kill_drill.py --nproc 3

1. The reference: lesson6_resumable.py from the beginning to the end, never interrupted.
2. The drill: the same run under `torchrun --max-restarts=3`. When the job reaches a random
   step, this script sends SIGKILL to one worker, chosen at random: the way a process dies
   when the machine runs out of memory, with no chance to save anything.
3. torchrun sees the dead worker, stops the others and starts them all again; they resume
   from the last snapshot and train to the end.
4. The check: the drill's final weights against the reference's, bit for bit.

The run's own event log (one JSON line per step, snapshot and resume) gives the timeline:
printed here, and drawn in runs/lesson6_timeline.png.
"""

import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddpcourse.cli import ArgumentParser  # noqa: E402
from ddpcourse.failures_draw import read_events  # noqa: E402
from ddpcourse.cluster.launch import LaunchError, launch  # noqa: E402

SCRIPT = "scripts/lesson6_resumable.py"


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
    if not 1 <= args.nproc <= 16 or args.epochs < 1:
        parser.error("--nproc must be 1-16 and --epochs >= 1")
    return args


def kill_when_reached(events_path, step, rank, done, report):
    """Watch the event log; at `step`, SIGKILL the worker of `rank` (its pid is logged)."""
    while not done.is_set():
        for event in read_events(events_path):
            if event["event"] == "step" and event["step"] == step and event["rank"] == rank:
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
    script_args = ["--epochs", str(args.epochs), "--snapshot-every", str(args.snapshot_every),
                   "--snapshot", str(snapshot),
                   "--checkpoint", str(out / f"{name}_final.pt"), "--events", str(events)]
    # c10d rendezvous, and workers that do not share its store: torchrun's restarts fail
    # without both in this torch (stale addresses from the dead attempt; see the reading).
    env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return events, out / f"{name}_final.pt", lambda: launch(
        SCRIPT, script_args, nproc=args.nproc, timeout=args.timeout, cwd=str(ROOT), env=env,
        torchrun_args=torchrun_args, rdzv="c10d")


def same_weights(a, b):
    import torch

    left, right = (torch.load(p, map_location="cpu", weights_only=False)["model"] for p in (a, b))
    differing = [k for k in left if not torch.equal(left[k], right[k])]
    return len(left), differing


def main():
    args = parse_args()
    rng = random.Random(args.seed)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print("== 1. reference: never interrupted", flush=True)
    reference_events, reference, start = run(args, "reference")
    if start().returncode != 0:
        sys.exit("error: the reference run failed (its output is above)")
    total = max(e["step"] for e in read_events(reference_events))  # the run's steps, counted
    if args.kill_step is not None and not 1 <= args.kill_step < total:
        sys.exit(f"error: --kill-step must be between 1 and {total - 1} (the run has {total})")
    # By default after the first snapshot, so that there is one to resume from.
    kill_step = args.kill_step or rng.randint(min(args.snapshot_every + 1, total - 1), total - 1)
    victim = rng.randrange(args.nproc)

    print(f"\n== 2. drill: the same {total} steps; at step {kill_step}, SIGKILL to rank "
          f"{victim}'s worker\n(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is set for it: see the "
          "reading)", flush=True)
    events, drilled, start = run(args, "drill", torchrun_args=["--max-restarts=3"])
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
    log = read_events(events)
    resume = next((e for e in log if e["event"] == "resume" and e["rank"] == 0), None)
    snapshots = [e for e in log if e["event"] == "snapshot"]
    print(f"kill:    step {kill_step}, rank {victim} (pid {report['pid']}), SIGKILL")
    if resume is None:
        print("resume:  none: no snapshot had been written yet, so the run started over")
    else:
        print(f"restart: torchrun stopped the other workers and started {args.nproc} new "
              f"ones; {resume['time'] - report['killed_at']:.1f} s from the kill to the "
              "resumed run")
        print(f"resume:  from step {resume['step']} (epoch {resume['epoch'] + 1}, "
              f"{resume['start']} of its samples done): {kill_step - resume['step']} step(s) "
              "done again, nothing else lost")
    if snapshots:
        seconds = sorted(e["seconds"] for e in snapshots)
        print(f"snapshots: {len(snapshots)}, {seconds[len(seconds) // 2] * 1000:.0f} ms each "
              "(median, rank 0 writing)")
    tensors, differing = same_weights(reference, drilled)
    if differing:
        sys.exit(f"check: FAILED: {len(differing)} of {tensors} tensors differ from the "
                 f"reference, e.g. {differing[0]}")
    print(f"check: the final weights are bit-identical to the reference's ({tensors} tensors, "
          f"world size {args.nproc})")
    with open(Path(args.out) / "drill_record.json", "w") as f:  # what the picture is drawn from
        json.dump({"events": [e for e in log if e["rank"] == 0], "kill": report}, f)
    try:
        from ddpcourse.failures_draw import draw_timeline

        picture = draw_timeline(log, report, "runs/lesson6_timeline.png")
        print(f"picture of this drill: {picture}")
    except ImportError:  # matplotlib missing: the numbers above are the result
        pass


if __name__ == "__main__":
    try:
        main()
    except LaunchError as error:
        sys.exit(f"error: {error}")
