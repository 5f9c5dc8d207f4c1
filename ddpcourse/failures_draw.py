"""Lesson 6's pictures, drawn from a run's own event log (lesson6_resumable.py --events).

`draw_timeline` puts every step rank 0 finished on a time axis: the steps before the kill,
the gap while torchrun restarts the workers, and the steps after the resume, with the
snapshots marked. The steps between the last snapshot and the kill are done twice: that is
the work a failure costs, and what --snapshot-every trades against the snapshots' own cost.
"""

from __future__ import annotations

import json
from pathlib import Path

from ddpcourse.topology import PALETTE

RECORDED = Path(__file__).resolve().parents[1] / "lessons" / "lesson6" / "figures"


def read_events(path) -> list[dict]:
    """The event log so far (one JSON object per complete line; a line being written is left
    for the next read). Several ranks append to it at once: short lines, opened in append
    mode, do not mix."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def draw_timeline(events: list[dict], kill: dict | None = None, path: str | None = None):
    """The run's steps over time, one colour per attempt; `kill` is the killed step's event
    (with `killed_at`). Saves to `path` when given and returns it, else returns the Figure."""
    import matplotlib

    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(e["time"] for e in events)
    attempts: list[list[dict]] = [[]]
    snapshots, resumes = [], []
    for e in events:
        if e["rank"] != 0:
            continue
        if e["event"] == "resume":
            attempts.append([])
            resumes.append(e)
        elif e["event"] == "step":
            attempts[-1].append(e)
        elif e["event"] == "snapshot":
            snapshots.append(e)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for n, steps in enumerate(a for a in attempts if a):
        ax.plot([e["time"] - t0 for e in steps], [e["step"] for e in steps], "o-", ms=4,
                color=PALETTE[n % len(PALETTE)],
                label="first attempt" if n == 0 else f"after restart {n}")
    if snapshots:
        ax.plot([e["time"] - t0 for e in snapshots], [e["step"] for e in snapshots], "v",
                ms=9, mfc="none", mec="#333333", label="snapshot written (rank 0)")
    if kill:
        x = kill["killed_at"] - t0
        ax.axvline(x, color="#D55E00", lw=1.5)
        ax.text(x, 0.6, f"  SIGKILL to rank {kill['rank']}\n  at step {kill['step']}",
                color="#D55E00", fontsize=9, va="bottom")
        for resume in resumes:
            ax.axvspan(x, resume["time"] - t0, color="#D55E00", alpha=0.12, lw=0)
            ax.text((x + resume["time"] - t0) / 2, resume["step"] / 2,
                    f"restart\n{resume['time'] - kill['killed_at']:.1f} s", ha="center",
                    fontsize=9, color="#D55E00")
            ax.annotate(f"resume from step {resume['step']}\n"
                        f"({kill['step'] - resume['step']} step(s) redone)",
                        (resume["time"] - t0, resume["step"]),
                        xytext=(10, -28), textcoords="offset points", fontsize=9,
                        arrowprops={"arrowstyle": "->", "color": "#555555"})
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("optimizer step")
    world = next((e["world_size"] for e in events if "world_size" in e), "?")
    ax.set_title(f"A worker killed mid-run, restarted by torchrun, resumed (world size {world})")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", fontsize=8.5)
    fig.tight_layout()
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    return fig


def recorded_drill() -> tuple[list[dict], dict]:
    """The event log of a real drill (make lesson6-kill NPROC=3), kept for the reading."""
    with open(RECORDED / "drill_events.json") as f:
        recorded = json.load(f)
    return recorded["events"], recorded["kill"]


def lesson_figures() -> dict:
    """Lesson 6's figures."""
    events, kill = recorded_drill()
    return {"kill_and_resume.png": draw_timeline(events, kill)}
