"""Lesson 6's pictures: a kill drill's timeline, Join's shadow collectives, resume positions.

`draw_timeline` puts every step rank 0 finished on a time axis, from a run's own event log
(scripts/lesson6_resumable.py --events): the steps before the kill, the gap while torchrun
restarts the workers, and the steps after the resume, with the snapshots marked. The steps
between the last snapshot and the kill are done twice: the work a failure costs, and what
--snapshot-every trades against the snapshots' own cost.

`draw_join` shows what `Join` makes a rank that has run out of data do while the others train
on; `draw_resume_positions` shows where a resumed epoch goes on when the world size changed.
"""

from __future__ import annotations

import json
from pathlib import Path

from ddpcourse.events import attempts_of
from ddpcourse.figures import save_or_return
from ddpcourse.topology import PALETTE

RECORDED = Path(__file__).resolve().parents[2] / "lessons" / "lesson6" / "figures"
KILL, DONE, SHADOW = "#D55E00", "#DDDDDD", "#FFFFFF"


def _figure(width: float, height: float):
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def draw_timeline(record: dict, path: str | None = None):
    """A kill drill's record (scripts/experiments/lesson6_kill_drill.py writes it): rank 0's
    steps over time, one colour per attempt, the kill, the restart and the snapshots."""
    if path:
        import matplotlib

        matplotlib.use("Agg")
    steps, kill = [e for e in record["events"] if e["rank"] == 0], record["kill"]
    every, per_epoch = record["snapshot_every"], record["steps_per_epoch"]
    t0 = min(e["time"] for e in steps)
    fig, ax = _figure(9, 4.2)
    attempts = attempts_of(steps)
    for n, attempt in enumerate(attempts):
        ax.plot([e["time"] - t0 for e in attempt], [e["step"] for e in attempt], "o-", ms=4,
                color=PALETTE[n % len(PALETTE)],
                label="first attempt" if n == 0 else f"after restart {n}")
    # The step's rank 0 writes a snapshot after these steps (not at an epoch's last one).
    written = [e for e in steps if e["step"] % every == 0 and e["step"] % per_epoch != 0]
    ax.plot([e["time"] - t0 for e in written], [e["step"] for e in written], "v", ms=9,
            mfc="none", mec="#333333", label="snapshot written (rank 0)")
    x = kill["killed_at"] - t0
    ax.axvline(x, color=KILL, lw=1.5)
    ax.text(x, 0.6, f"  SIGKILL to rank {kill['rank']}\n  at step {kill['step']}", color=KILL,
            fontsize=9, va="bottom")
    for before, attempt in zip(attempts, attempts[1:], strict=False):
        first = attempt[0]  # the first step after the resume
        ax.axvspan(x, first["time"] - t0, color=KILL, alpha=0.12, lw=0)
        ax.text((x + first["time"] - t0) / 2, first["step"] / 2,
                f"restart\n{first['time'] - kill['killed_at']:.1f} s", ha="center", fontsize=9,
                color=KILL)
        ax.annotate(f"resumed from step {first['step'] - 1}\n"
                    f"({before[-1]['step'] - first['step'] + 1} step(s) done again)",
                    (first["time"] - t0, first["step"]), xytext=(10, -28),
                    textcoords="offset points", fontsize=9,
                    arrowprops={"arrowstyle": "->", "color": "#555555"})
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("optimizer step")
    ax.set_title("A worker killed mid-run, restarted by torchrun, resumed "
                 f"(world size {steps[0]['world_size']})")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", fontsize=8.5)
    fig.tight_layout()
    return save_or_return(fig, path)


def _box(ax, x, y, text, face, hatch=None, edge="#333333", width=0.9, height=0.62):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x - width / 2, y - height / 2), width, height, facecolor=face,
                           edgecolor=edge, hatch=hatch, lw=1))
    ax.text(x, y, text, ha="center", va="center", fontsize=8)


def draw_join(batches: tuple[int, ...] = (4, 5, 6)):
    """Ranks with `batches` batches each under `with Join([ddp_model])`: per step, the rank's
    own forward and backward with their all-reduces, or, once it has run out, the shadows it
    runs instead; and what the gradient is divided by, with either setting."""
    world, steps = len(batches), max(batches)
    fig, ax = _figure(1.25 * steps + 3.2, 0.95 * world + 2.6)
    for rank, own in enumerate(batches):
        y = world - rank
        ax.text(0.2, y, f"rank {rank}\n{own} batches", ha="right", va="center", fontsize=9)
        for step in range(1, steps + 1):
            if step <= own:
                _box(ax, step, y, "its batch:\ncount +1,\nits gradients", PALETTE[rank])
            else:
                _box(ax, step, y, "shadow:\ncount +0,\nzeros", SHADOW, hatch="//")
    ax.text(steps + 0.6, world / 2 + 0.5, "count 0: every\nrank leaves the\nloop; the last to\n"
            "run out sends\nits weights to all\n(a broadcast)", fontsize=8, va="center")
    active = [sum(own >= step for own in batches) for step in range(1, steps + 1)]
    rows = [("count: ranks with a batch\n(an all-reduce each step)", [str(a) for a in active]),
            ("gradient sum divided by:\ndefault (True)", [str(world)] * steps),
            ("divide_by_initial_world\n_size=False", [str(a) for a in active])]
    for i, (label, cells) in enumerate(rows):
        y = -0.1 - 0.55 * i
        ax.text(0.2, y, label, ha="right", va="center", fontsize=8)
        for step, cell in enumerate(cells, 1):
            ax.text(step, y, cell, ha="center", va="center", fontsize=9,
                    color=KILL if i and cell != str(world) else "#222222")
    for step in range(1, steps + 1):
        ax.text(step, world + 0.55, f"step {step}", ha="center", fontsize=9)
    ax.set_xlim(-1.6, steps + 1.8)
    ax.set_ylim(-0.1 - 0.55 * len(rows), world + 0.8)
    ax.axis("off")
    ax.set_title("Join: a rank out of data shadows every collective of the others' steps",
                 fontsize=10)
    fig.tight_layout()
    return fig


def draw_resume_positions(samples: int = 24, before: int = 3, after: int = 2,
                          batch: int = 6, steps_done: int = 2):
    """An epoch of `samples` positions (DistributedSampler's shuffled order), trained
    `steps_done` steps of global batch `batch` at `before` ranks, then resumed at `after`:
    by position over all ranks (right), and by each rank skipping what it had done (wrong)."""
    fig, ax = _figure(0.42 * samples + 2.8, 3.9)
    start = steps_done * batch

    def row(y, owner, title, marks=None):
        ax.text(-0.6, y, title, ha="right", va="center", fontsize=8.5)
        for p in range(samples):
            rank = owner(p)
            face = DONE if rank is None else PALETTE[rank]
            _box(ax, p, y, "" if rank is None else str(rank), face, width=0.92, height=0.7,
                 edge=KILL if marks and p in marks else "#333333")
            if marks and p in marks:
                ax.text(p, y - 0.55, marks[p], ha="center", fontsize=7, color=KILL)

    row(3, lambda p: p % before if p < start else None,
        f"W = {before}: steps 1-{steps_done} train\npositions 0-{start - 1}, then a failure")
    row(2, lambda p: None if p < start else (p - start) % after,
        f"resumed at W = {after} from\nposition {start}: order[{start}:][r::{after}]")
    own_done = start // before  # what each old rank had done, counted per rank
    skipped = {p: (p % after) for p in range(samples) if p // after >= own_done}
    again = {p: "again" for p in skipped if p < start}
    row(1, lambda p: skipped.get(p),
        f"wrong: each new rank skips its\nown first {own_done} ({start} / {before})", again)
    for p in range(0, samples, batch):
        ax.axvline(p - 0.5, color="#888888", lw=0.8, ls=":")
    ax.axvline(start - 0.5, color=KILL, lw=1.5)
    ax.text(start - 0.5, 3.75, f" start = {start}", color=KILL, fontsize=9)
    for p in range(samples):
        ax.text(p, 3.45, str(p), ha="center", fontsize=6.5, color="#666666")
    ax.set_xlim(-6.5, samples)
    ax.set_ylim(0.2, 4.05)
    ax.axis("off")
    ax.set_title(f"Where a resumed epoch goes on: positions of the epoch's order (numbers: "
                 f"the rank that trains it; dotted: steps of {batch})", fontsize=10)
    fig.tight_layout()
    return fig


def recorded_drill() -> dict:
    """The record of a real drill (make lesson6-kill NPROC=3), kept for the reading."""
    with open(RECORDED / "drill_record.json") as f:
        return json.load(f)


def lesson_figures() -> dict:
    """Lesson 6's figures."""
    return {"kill_and_resume.png": draw_timeline(recorded_drill()),
            "join_shadows.png": draw_join(),
            "resume_positions.png": draw_resume_positions()}
