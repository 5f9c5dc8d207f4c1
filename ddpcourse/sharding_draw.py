"""Lesson 8's pictures: model state per rank against the world size, the memory a run measured,
and a pipeline's timeline drawn from the forwards and backwards its stages timed.

The reading's figures are drawn from runs recorded in lessons/lesson8/figures/ (the commands
that recorded them are in lessons/lesson8/README.md); the scripts draw their own runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from ddpcourse.sharding import PARTS, STRATEGIES, predict, transformer_shapes
from ddpcourse.topology import PALETTE

RECORDED = Path(__file__).resolve().parents[1] / "lessons" / "lesson8" / "figures"
LABELS = {"ddp": "DDP", "zero": "ZeRO-1 (ZeroRedundancyOptimizer)", "fsdp": "FSDP2 (fully_shard)"}
PART_COLOURS = {"params": PALETTE[1], "grads": PALETTE[0], "optimizer": PALETTE[2]}


def _pyplot(path):
    import matplotlib

    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _done(fig, path):
    fig.tight_layout()
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        _pyplot(path).close(fig)
        return path
    return fig


def draw_memory_vs_world(shapes=None, optimizer: str = "adam", device_gb: float = 80,
                         world_sizes=(1, 2, 4, 8, 16, 32, 64), title: str | None = None,
                         path: str | None = None):
    """What the most loaded rank keeps (weights + gradients + optimizer state, fp32) against
    the world size, for each strategy; a line at one device's memory. Default: a 7B model."""
    plt = _pyplot(path)
    shapes = shapes or transformer_shapes()
    count = sum(_numel(s) for s in shapes)
    fig, ax = plt.subplots(figsize=(8, 4.4))
    for n, strategy in enumerate(STRATEGIES):
        worst = [max(r["total"] for r in predict(shapes, w, strategy, optimizer)) / 1e9
                 for w in world_sizes]
        ax.plot(world_sizes, worst, "o-", color=PALETTE[n + 4], label=LABELS[strategy])
    ax.axhline(device_gb, color="#D55E00", ls="--", lw=1.2)
    ax.text(world_sizes[-1], device_gb * 1.08, f"one {device_gb:g} GB GPU", ha="right",
            color="#D55E00", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(world_sizes, [str(w) for w in world_sizes])
    ax.set_xlabel("ranks (GPUs) W")
    ax.set_ylabel("GB per rank, most loaded rank")
    ax.set_title(title or f"Model state per rank: {count / 1e9:.2f} B parameters, fp32, "
                          f"{optimizer} (activations not included)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=9)
    return _done(fig, path)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def read_records(path) -> list[dict]:
    """The JSON lines lesson8_memory.py --record appended, one per run."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def draw_measured_memory(records: list[dict], path: str | None = None):
    """For each recorded world size and strategy, the bytes every rank measured, stacked by
    part, and the prediction for that rank as a black tick."""
    plt = _pyplot(path)
    records = sorted(records, key=lambda r: r["world_size"])
    fig, axes = plt.subplots(1, len(records), figsize=(3.4 * len(records) + 0.6, 4.2),
                             sharey=True, squeeze=False)
    for ax, record in zip(axes[0], records, strict=True):
        w = record["world_size"]
        x, ticks = 0.0, []
        for strategy in STRATEGIES:
            held = record["held"][strategy]
            predicted = predict([tuple(s) for s in record["shapes"]], w, strategy,
                                record["optimizer"])
            start = x
            for rank, (h, p) in enumerate(zip(held, predicted, strict=True)):
                bottom = 0.0
                for part in PARTS:
                    ax.bar(x, h[part] / 1e6, bottom=bottom, width=0.8,
                           color=PART_COLOURS[part], edgecolor="white", lw=0.5,
                           label=part if (w, strategy, rank) == (records[0]["world_size"],
                                                                 "ddp", 0) else None)
                    bottom += h[part] / 1e6
                ax.plot([x - 0.4, x + 0.4], [p["total"] / 1e6] * 2, color="black", lw=1.5,
                        label="predicted" if (w, strategy, rank) == (
                            records[0]["world_size"], "ddp", 0) else None)
                x += 1
            ticks.append(((start + x - 1) / 2, strategy))
            x += 0.8
        ax.set_xticks([t for t, _ in ticks], [s for _, s in ticks])
        ax.set_title(f"W = {w} (one bar per rank)", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("MB on the rank")
    handles, labels = axes[0][0].get_legend_handles_labels()
    axes[0][-1].legend(handles, labels, fontsize=8, loc="upper right")  # the emptiest corner
    model = records[0]["model"]
    fig.suptitle(f"Measured per rank: {model}, {records[0]['optimizer']}, after a step "
                 "(weights, gradients, optimizer state)", fontsize=10)
    return _done(fig, path)


def draw_pipeline(runs: list[dict], path: str | None = None):
    """One panel per run: a row per stage, a box per micro-batch's forward (light) and
    backward (dark), on the step's time axis; the white gaps are the bubble."""
    plt = _pyplot(path)
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.0 + 0.55 * sum(
        len(r["events"]) for r in runs) + 0.5 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        stages = len(run["events"])
        end = max(e for events in run["events"] for *_, e in events)
        for stage, events in enumerate(run["events"]):
            y = stages - 1 - stage
            ax.barh(y, end * 1e3, left=0, height=0.7, color="#f0f0f0", edgecolor="none")
            for kind, chunk, start, stop in events:
                colour = PALETTE[chunk % len(PALETTE)]
                ax.barh(y, (stop - start) * 1e3, left=start * 1e3, height=0.7, color=colour,
                        alpha=0.45 if kind == "F" else 0.95, edgecolor="#333333", lw=0.5)
                ax.text((start + stop) / 2 * 1e3, y, f"{kind}{chunk}", ha="center",
                        va="center", fontsize=7)
        ax.set_yticks(range(stages), [f"stage {s}" for s in reversed(range(stages))])
        ax.set_xlim(0, end * 1e3 * 1.01)
        ax.set_title(f"{run['schedule'].upper()}, S = {stages}, M = {run['micro_batches']}: "
                     f"bubble measured {run['bubble']:.2f} (median step), "
                     f"(S-1)/(M+S-1) = {run['expected']:.2f}", fontsize=9.5)
    axes[-1, 0].set_xlabel("ms since the step started (F = forward, B = backward of a "
                           "micro-batch; grey = waiting)")
    return _done(fig, path)


def lesson_figures() -> dict:
    """Lesson 8's figures, from the recorded runs beside them."""
    with open(RECORDED / "pipeline_events.json") as f:
        pipeline = json.load(f)
    return {
        "memory_vs_world_size.png": draw_memory_vs_world(),
        "memory_measured.png": draw_measured_memory(read_records(RECORDED /
                                                                 "memory_measured.jsonl")),
        "pipeline_timeline.png": draw_pipeline(pipeline["runs"]),
    }
