"""Lesson 7's pictures, each drawn from a run's own numbers.

- The overlap timeline, from the Chrome traces that torch.profiler wrote on every rank
  (scripts/experiments/lesson7_overlap_bench.py --trace): forward, backward, waiting and
  the optimizer step on one lane per rank, the all-reduces on a second lane below it.
- Data-loader throughput against num_workers (scripts/experiments/lesson7_loader_bench.py).
- Memory per process, unique and shared, for a dataset loaded by every process against one
  loaded once and shared (scripts/experiments/lesson7_shared_dataset.py --json).

The readings' figures come from runs recorded in lessons/lesson7/figures/*.json (the command
that made each is stored beside its numbers); `make figures` redraws them from there.
"""

from __future__ import annotations

import json
from pathlib import Path

from ddpcourse.figures import save_or_return
from ddpcourse.topology import PALETTE
from ddpcourse.traces import overlap_of

RECORDED = Path(__file__).resolve().parents[2] / "lessons" / "lesson7" / "figures"
MARKER_COLOURS = {"forward": PALETTE[1], "backward": PALETTE[4], "wait for all-reduces":
                  "#BBBBBB", "optimizer step": PALETTE[2]}
COMM_COLOUR = PALETTE[5]


def draw_overlap(record: dict, path: str | None = None):
    """One panel per traced mode, two lanes per rank (its step's phases; its all-reduces),
    all panels on one time axis, so their lengths compare. `record` is what
    experiments/lesson7_overlap_bench.py --trace writes to overlap_spans.json."""
    import matplotlib

    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = record["ranks"]
    modes = [m for m in ranks[0]]
    fig, axes = plt.subplots(len(modes), 1, figsize=(10, 1.2 + 1.3 * len(modes) * len(ranks)),
                             squeeze=False)
    starts = {mode: min(s[1] for r in ranks for s in r[mode]["compute"]) for mode in modes}
    longest = max(s[2] - starts[mode] for mode in modes for r in ranks
                  for s in r[mode]["compute"] + r[mode]["comm"])
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        t0 = starts[mode]
        labels = []
        for r, spans in enumerate(ranks):
            y = (len(ranks) - 1 - r) * 2.6
            for name, start, end in spans[mode]["compute"]:
                ax.barh(y + 1, end - start, left=start - t0, height=0.8,
                        color=MARKER_COLOURS[name], edgecolor="white", lw=0.5)
            # gloo runs collectives on more than one thread: overlapping ones get sub-rows
            rows: list[float] = []
            placed = []
            for _, start, end in spans[mode]["comm"]:
                row = next((i for i, free in enumerate(rows) if free <= start), len(rows))
                rows[row:row + 1] = [end]
                placed.append((row, start, end))
            height = 0.8 / max(1, len(rows))
            for row, start, end in placed:
                ax.barh(y - 0.4 + height * (row + 0.5), end - start, left=start - t0,
                        height=height * 0.9, color=COMM_COLOUR, alpha=0.7, lw=0)
            seen = overlap_of(spans[mode])
            labels += [(y + 1, f"rank {r}: its step"),
                       (y, f"rank {r}: all-reduces\n{seen['early']} of {seen['count']} "
                           "began in backward")]
        ax.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=8)
        ax.set_title(mode, fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlim(0, longest * 1.02)  # the same scale in every panel
    axes[-1, 0].set_xlabel("milliseconds since the step started")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in MARKER_COLOURS.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, color=COMM_COLOUR, alpha=0.7))
    fig.suptitle(f"One training step of {record['model']} on {len(ranks)} ranks "
                 f"({record['device']}): where the all-reduces run", fontsize=11)
    fig.legend(handles, [*MARKER_COLOURS, "all-reduce"], loc="lower center", ncol=5,
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return save_or_return(fig, path)


# --- data loading --------------------------------------------------------------------------

def draw_loader(record: dict, path: str | None = None):
    """Samples/s against num_workers, one line per setting (the median of the rounds, their
    range shaded); the machine's cores marked.
    `record` is what experiments/lesson7_loader_bench.py --json writes."""
    import matplotlib

    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    rows = record["scaling"]
    settings = sorted({r["setting"] for r in rows}, key=[r["setting"] for r in rows].index)
    for n, setting in enumerate(settings):
        mine = [r for r in rows if r["setting"] == setting]
        ax.plot([r["num_workers"] for r in mine], [r["samples_per_s"] for r in mine], "o-",
                color=PALETTE[n % len(PALETTE)], label=setting)
        if all("low" in r for r in mine):  # repeated rounds: their range, shaded
            ax.fill_between([r["num_workers"] for r in mine], [r["low"] for r in mine],
                            [r["high"] for r in mine], color=PALETTE[n % len(PALETTE)],
                            alpha=0.2, lw=0)
    cores = record["cores"]
    ax.axvline(cores, color="#555555", ls="--", lw=1)
    ax.text(cores, ax.get_ylim()[1] * 0.97, f" {cores} cores", va="top", fontsize=9)
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s (decode + augment + collate)")
    ranged = all("low" in r for r in rows)
    ax.set_title(f"DataLoader throughput on this machine ({cores} cores, {record['device']})"
                 + ("\nline: the median of the rounds; shaded: their range" if ranged else ""),
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_or_return(fig, path)


# --- shared memory -------------------------------------------------------------------------

def draw_memory(record: dict, path: str | None = None):
    """The memory each process added by loading and reading the dataset, unique (USS) and
    shared with other processes, for each way of loading it. `record` is what
    experiments/lesson7_shared_dataset.py --json writes (one run per mode)."""
    import matplotlib

    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = record["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(4.4 * len(runs), 4.0), sharey=True,
                             squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        ranks = [p["rank"] for p in run["processes"]]
        unique = [max(0.0, p["uss_growth_mb"]) for p in run["processes"]]
        shared = [max(0.0, p["shared_growth_mb"]) for p in run["processes"]]
        ax.bar(ranks, unique, color=PALETTE[5], label="unique to the process (USS)")
        ax.bar(ranks, shared, bottom=unique, color=PALETTE[1], label="shared with the others")
        ax.axhline(run["dataset_mb"], color="#333333", ls=":", lw=1)
        ax.text(ranks[0] - 0.4, run["dataset_mb"], " dataset size", va="bottom", fontsize=8)
        ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
        ax.set_title(f"{run['mode']}: {sum(unique):.0f} MB unique in all", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].set_ylabel("MB added by loading and reading the dataset")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"A {runs[0]['dataset_mb']:.0f} MB in-memory dataset on "
                 f"{len(runs[0]['processes'])} processes: one copy each, or one for all",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return save_or_return(fig, path)


def recorded(name: str) -> dict:
    with open(RECORDED / name) as f:
        return json.load(f)


def lesson_figures() -> dict:
    """Lesson 7's figures, from the runs recorded beside them."""
    return {"overlap_timeline.png": draw_overlap(recorded("overlap_spans.json")),
            "loader_scaling.png": draw_loader(recorded("loader.json")),
            "shared_memory.png": draw_memory(recorded("shared_memory.json"))}
