"""How much memory grading one submission of each lesson holds at its peak: what to give
Gradescope's autograder machine, or a SLURM task per student graded at once.

    python scripts/experiments/grading_memory.py              # every graded lesson
    python scripts/experiments/grading_memory.py --lessons 1 4

Each lesson's reference solutions are graded once, as `make grade LESSON=n IMPL=solutions`
grades them (the judge, its sandboxes and every job they start); every 0.1 s the whole process
tree's memory is read from /proc, each shared page counted once (the sum of the processes'
proportional set sizes: a job's ranks are forks that share torch's pages). It prints one
line per lesson, then a summary line:

    lesson 1: peak 1.62 GB (graded 20 of 20 in 9.8 s)
    summary: lessons=1,3 peak_gb=1.62,2.01 largest_gb=2.01

Sampling can miss a peak shorter than 0.1 s, so the figures are a little low, never high.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ddpcourse.course.grading import graded_lessons, summarise
from ddpcourse.course.sandbox import processes_of, resident_bytes
from ddpcourse.exercises import ROOT

GB = 1e9


def peak_while(proc: subprocess.Popen, every: float = 0.1) -> float:
    """The most memory proc and its descendants held at once while it ran, in bytes."""
    peak = 0

    def sample() -> None:
        nonlocal peak
        while proc.poll() is None:
            peak = max(peak, resident_bytes([proc.pid, *processes_of(None, proc.pid)]))
            time.sleep(every)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    proc.wait()
    watcher.join()
    return peak


def measure(lesson: int, timeout: float) -> tuple[float, float, float, float]:
    """(peak bytes, points earned, points possible, seconds) of grading lesson's reference."""
    with tempfile.TemporaryDirectory(prefix="grading-memory-") as out:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "ddpcourse.course.grading", "grade",
                                 "--lesson", str(lesson), "--impl", "solutions", "--out", out],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            peak = peak_while(proc)
        finally:
            timer.cancel()
        seconds = time.perf_counter() - started
        results = Path(out) / "results.json"
        scores = summarise(json.loads(results.read_text())["tests"]) if results.exists() else {}
    earned = sum(s["earned"] for s in scores.values())
    possible = sum(s["possible"] for s in scores.values())
    return peak, earned, possible, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lessons", type=int, nargs="+", default=None,
                        help="the lessons to measure (default: every graded lesson)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per lesson")
    args = parser.parse_args()
    lessons = args.lessons or graded_lessons()
    unknown = sorted(set(lessons) - set(graded_lessons()))
    if unknown:
        print(f"error: --lessons {' '.join(map(str, unknown))}: not a graded lesson "
              f"(graded: {' '.join(map(str, graded_lessons()))})", file=sys.stderr)
        return 2
    peaks = []
    for lesson in lessons:
        peak, earned, possible, seconds = measure(lesson, args.timeout)
        peaks.append(peak)
        print(f"lesson {lesson}: peak {peak / GB:.2f} GB (graded {earned:g} of {possible:g} "
              f"in {seconds:.1f} s)", flush=True)
    print(f"summary: lessons={','.join(map(str, lessons))} "
          f"peak_gb={','.join(f'{p / GB:.2f}' for p in peaks)} largest_gb={max(peaks) / GB:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
