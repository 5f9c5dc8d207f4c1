"""Lesson 8's pictures: model state per rank against the world size, the memory a run measured,
a pipeline's timeline drawn from the forwards and backwards its stages timed, and three
diagrams: what each ZeRO stage shards, a linear layer split by columns and by rows (tensor
parallelism), and FSDP's one shard group against HSDP's 2-D mesh.

The measured figures are drawn from runs recorded in lessons/lesson8/figures/ (the commands
that recorded them are in lessons/lesson8/README.md); the scripts draw their own runs. The
diagrams are drawn from nothing but the rules they show.
"""

from __future__ import annotations

import json
from pathlib import Path

from ddpcourse.figures import finish, pyplot
from ddpcourse.sharding import PARTS, STRATEGIES, predict, read_records, transformer_shapes
from ddpcourse.topology import PALETTE

RECORDED = Path(__file__).resolve().parents[2] / "lessons" / "lesson8" / "figures"
LABELS = {"ddp": "DDP", "zero": "ZeRO-1 (ZeroRedundancyOptimizer)", "fsdp": "FSDP2 (fully_shard)"}
PART_COLOURS = {"params": PALETTE[1], "grads": PALETTE[0], "buckets": PALETTE[3],
                "optimizer": PALETTE[2]}
RANK_COLOURS = PALETTE[:4]  # rank r's piece, in every diagram: orange, sky blue, green, yellow



def draw_memory_vs_world(shapes=None, optimizer: str = "adam", device_gb: float = 80,
                         world_sizes=(1, 2, 4, 8, 16, 32, 64), title: str | None = None,
                         path: str | None = None):
    """What the most loaded rank keeps (weights + gradients + optimizer state, fp32) against
    the world size, for each strategy; a line at one device's memory. Default: a 7B model."""
    plt = pyplot(path)
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
    return finish(fig, path)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def draw_measured_memory(records: list[dict], path: str | None = None):
    """For each recorded world size and strategy, the bytes every rank measured, stacked by
    part, and the prediction for that rank as a black tick."""
    plt = pyplot(path)
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
                 "(weights, gradients, DDP's buckets, optimizer state)", fontsize=10)
    return finish(fig, path)


def draw_pipeline(runs: list[dict], path: str | None = None):
    """One panel per run: a row per stage, a box per micro-batch's forward (light) and
    backward (dark), on the step's time axis; the white gaps are the bubble."""
    plt = pyplot(path)
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
    return finish(fig, path)


# --- diagrams: drawn from the rules they show, no run needed ---------------------------------

def _box(ax, x, y, w, h, colour, text="", alpha=0.75, fontsize=8, dashed=False, **kwargs):
    """A rectangle with its lower left corner at (x, y), and text in its middle."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, alpha=alpha,
                           edgecolor="#333333", lw=0.8, ls="--" if dashed else "-"))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize,
                **kwargs)


def _arrow(ax, start, end, colour="#333333", text="", style="-|>", rad=0.0, fontsize=8,
           offset=(0, 0.18)):
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, lw=1.4,
                                 color=colour, connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text,
                ha="center", va="bottom", fontsize=fontsize, color=colour)


ZERO_STAGES = [("DDP", set()), ("ZeRO-1", {"optimizer"}), ("ZeRO-2", {"optimizer", "grads"}),
               ("ZeRO-3, FSDP", {"optimizer", "grads", "params"})]
PART_NAMES = {"params": "weights", "grads": "gradients", "optimizer": "optimizer state"}


def draw_zero_stages(world_size: int = 4, path: str | None = None):
    """What each rank keeps between steps under DDP and ZeRO's three stages, Adam in fp32:
    per rank, one bar per part (weights 4, gradients 4, optimizer state 8 bytes per
    parameter); a sharded part keeps only the rank's 1/W of the bar, the rest left empty."""
    plt = pyplot(path)
    fig, ax = plt.subplots(figsize=(11, 6.2))
    bytes_per = {"params": 4, "grads": 4, "optimizer": 8}
    scale, gap, row_h = 0.34, 0.7, 1.55   # bar length per byte, between ranks, per stage
    rank_w = 8 * scale                    # the longest bar: Adam's two moments
    for row, (name, sharded) in enumerate(ZERO_STAGES):
        top = -row * row_h
        ax.text(-0.25, top - 0.45, name, ha="right", va="center", fontsize=10,
                fontweight="bold")
        ax.text(-0.25, top - 0.8, "shards: " + (", ".join(PART_NAMES[p] for p in
                                                         ("optimizer", "grads", "params")
                                                         if p in sharded) or "nothing"),
                ha="right", va="center", fontsize=7.5, color="#555555")
        for rank in range(world_size):
            x0 = rank * (rank_w + gap)
            for i, part in enumerate(("params", "grads", "optimizer")):
                y = top - 0.3 * (i + 1)
                length = bytes_per[part] * scale
                if part in sharded:   # this rank's 1/W, at its place in the whole
                    _box(ax, x0, y, length, 0.24, "white", alpha=1, dashed=True)
                    piece = length / world_size
                    _box(ax, x0 + rank * piece, y, piece, 0.24, PART_COLOURS[part], alpha=0.9)
                else:
                    _box(ax, x0, y, length, 0.24, PART_COLOURS[part], alpha=0.9)
            if row == 0:
                ax.text(x0 + rank_w / 2, 0.25, f"rank {rank}", ha="center", fontsize=9)
        terms = [f"{bytes_per[p]}/W" if p in sharded else str(bytes_per[p])
                 for p in ("params", "grads", "optimizer")]
        total = sum(bytes_per[p] / (world_size if p in sharded else 1) for p in bytes_per)
        ax.text(world_size * (rank_w + gap) - gap + 0.3, top - 0.6,
                f"bytes per rank:\n({' + '.join(terms)}) N\n= {total:g} N at W = {world_size}",
                ha="left", va="center", fontsize=9)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=PART_COLOURS[part], edgecolor="#333333",
                     label=f"{PART_NAMES[part]} ({bytes_per[part]} bytes per parameter)")
               for part in ("params", "grads", "optimizer")]
    handles.append(Patch(facecolor="white", edgecolor="#333333", ls="--",
                         label="the pieces the other ranks keep"))
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, -0.08), ncol=4,
              fontsize=8, frameon=False)
    ax.set_xlim(-3.4, world_size * (rank_w + gap) + 2.6)
    ax.set_ylim(-len(ZERO_STAGES) * row_h + 0.3, 0.6)
    ax.axis("off")
    ax.set_title(f"What each of W = {world_size} ranks keeps between steps: Adam, fp32, a model "
                 "of N parameters (the ZeRO paper's stages; activations not included)",
                 fontsize=10)
    return finish(fig, path)


def draw_tensor_parallel(path: str | None = None):
    """y = x W^T on two ranks: split by the output's columns (ColwiseParallel), by the input's
    features (RowwiseParallel), and the two in a row (a transformer's MLP)."""
    plt = pyplot(path)
    fig, axes = plt.subplots(3, 1, figsize=(10, 9.6))
    whole, r0, r1 = "#dddddd", RANK_COLOURS[0], RANK_COLOURS[1]

    ax = axes[0]   # A: columns
    ax.set_title("A. Split by columns (ColwiseParallel): rank r keeps W's rows for its output "
                 "features, weight Shard(0)", fontsize=9.5, loc="left")
    _box(ax, 0, 0.6, 2.2, 1.2, whole, "x\nbatch x in\nwhole on every rank")
    ax.text(2.55, 1.2, "x", ha="center", va="center", fontsize=12)
    _box(ax, 2.9, 0.2, 1.2, 2.0, r0, "W$^T$\ncolumns\nof rank 0")
    _box(ax, 4.1, 0.2, 1.2, 2.0, r1, "W$^T$\ncolumns\nof rank 1")
    ax.text(5.65, 1.2, "=", ha="center", va="center", fontsize=12)
    _box(ax, 6.0, 0.6, 1.2, 1.2, r0, "y slice\nrank 0")
    _box(ax, 7.2, 0.6, 1.2, 1.2, r1, "y slice\nrank 1")
    ax.text(8.7, 1.2, "no communication:\neach rank computes its\nslice from the whole x.\n"
            "Joining the slices\n(y.full_tensor()): all-gather", ha="left", va="center",
            fontsize=8.5)

    ax = axes[1]   # B: rows
    ax.set_title("B. Split by rows (RowwiseParallel): rank r keeps W's columns that meet its "
                 "slice of x's features, weight Shard(1)", fontsize=9.5, loc="left")
    _box(ax, 0, 0.6, 1.1, 1.2, r0, "x slice\nrank 0")
    _box(ax, 1.1, 0.6, 1.1, 1.2, r1, "x slice\nrank 1")
    ax.text(2.55, 1.2, "x", ha="center", va="center", fontsize=12)
    _box(ax, 2.9, 1.2, 1.2, 1.0, r0, "W$^T$ rows\nof rank 0")
    _box(ax, 2.9, 0.2, 1.2, 1.0, r1, "W$^T$ rows\nof rank 1")
    ax.text(4.45, 1.2, "=", ha="center", va="center", fontsize=12)
    _box(ax, 4.8, 1.3, 1.2, 0.9, r0, "partial y\nrank 0", alpha=0.5)
    _box(ax, 4.8, 0.2, 1.2, 0.9, r1, "partial y\nrank 1", alpha=0.5)
    _arrow(ax, (6.1, 1.2), (7.1, 1.2), "#D55E00", "all-reduce\n(sum)", offset=(0, 0.12))
    _box(ax, 7.2, 0.6, 1.2, 1.2, whole, "y whole\non every\nrank")
    ax.text(8.7, 1.2, "one all-reduce of\nbatch x out values;\nthe next layer waits\n"
            "for it. The bias is\nadded once, after it", ha="left", va="center", fontsize=8.5)

    ax = axes[2]   # C: the MLP
    ax.set_title("C. Columns, then rows (a transformer's MLP): the first layer's output slice "
                 "is the second layer's input slice", fontsize=9.5, loc="left")
    _box(ax, 0, 0.6, 1.3, 1.2, whole, "x whole")
    _arrow(ax, (1.35, 1.2), (2.15, 1.2), "#333333", "up\n(columns)", offset=(0, 0.12))
    _box(ax, 2.2, 0.6, 0.9, 1.2, r0, "h slice\nrank 0")
    _box(ax, 3.1, 0.6, 0.9, 1.2, r1, "h slice\nrank 1")
    _arrow(ax, (4.05, 1.2), (4.85, 1.2), "#333333", "down\n(rows)", offset=(0, 0.12))
    _box(ax, 4.9, 1.3, 1.2, 0.9, r0, "partial y\nrank 0", alpha=0.5)
    _box(ax, 4.9, 0.2, 1.2, 0.9, r1, "partial y\nrank 1", alpha=0.5)
    _arrow(ax, (6.15, 1.2), (7.1, 1.2), "#D55E00", "all-reduce", offset=(0, 0.12))
    _box(ax, 7.2, 0.6, 1.2, 1.2, whole, "y whole")
    ax.text(8.7, 1.2, "forward: one all-reduce\n(of the output); backward:\none more, of x's "
            "gradient\n(mid-model). Both carry\nactivations, not weights", ha="left",
            va="center", fontsize=8.5)
    for ax in axes:
        ax.set_xlim(-0.2, 10.8)
        ax.set_ylim(0, 2.5)
        ax.axis("off")
    fig.suptitle("Tensor parallelism on 2 ranks: a linear layer y = x W$^T$ + b "
                 "(orange: rank 0's piece, blue: rank 1's, grey: whole on every rank)",
                 fontsize=10)
    return finish(fig, path)


def draw_hsdp_mesh(nodes: int = 2, per_node: int = 4, path: str | None = None):
    """FSDP over all ranks against HSDP on a (nodes, per_node) mesh: which ranks share one
    model's pieces, and which collectives cross the network between nodes."""
    plt = pyplot(path)
    from matplotlib.patches import FancyBboxPatch

    def group(ax, x, y, w, h, colour, text):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.04", facecolor="none",
                                    edgecolor=colour, lw=1.8, ls="--"))
        ax.text(x + w, y + h + 0.08, text, ha="right", va="bottom", fontsize=7.5, color=colour)

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.4))
    world, node_w, node_h, step = nodes * per_node, per_node * 1.3 + 0.3, 1.9, 2.6
    for ax, hybrid in zip(axes, (False, True), strict=True):
        for node in range(nodes):
            y0 = (nodes - 1 - node) * step
            ax.add_patch(FancyBboxPatch((0, y0), node_w, node_h, boxstyle="round,pad=0.05",
                                        facecolor="#f3f3f3", edgecolor="#333333", lw=1.2))
            ax.text(0.15, y0 + node_h - 0.17, f"node {node}", fontsize=8.5, fontweight="bold",
                    va="center")
            for local in range(per_node):
                rank = node * per_node + local
                piece = local if hybrid else rank
                _box(ax, 0.3 + local * 1.3, y0 + 0.2, 1.0, 1.1, PALETTE[piece % len(PALETTE)],
                     f"R{rank}\npiece {piece}\n1/{per_node if hybrid else world} of each",
                     alpha=0.55, fontsize=7.5)
            if hybrid:   # the shard group: this node's GPUs, over the fast links
                group(ax, 0.2, y0 + 0.1, node_w - 0.4, 1.3, "#009E73",
                      "shard group: all-gather, reduce-scatter (NVLink)")
        if hybrid:
            for local in range(per_node):   # the replicate groups: one per local rank
                x = 0.8 + local * 1.3
                _arrow(ax, (x, node_h + 0.06), (x, step - 0.06), "#D55E00", style="<|-|>")
            ax.text(node_w / 2, (node_h + step) / 2, "replicate groups (R0, R4), (R1, R5), ...: "
                    "all-reduce of each gradient piece (network)", ha="center", va="center",
                    fontsize=7.5, color="#D55E00",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
            ax.set_title(f"HSDP: fully_shard on a 2-D mesh ({nodes}, {per_node}), dims "
                         "(replicate, shard)\nshard inside a node, replicate across nodes",
                         fontsize=9.5)
            note = (f"a rank keeps 1/{per_node} of the model; only gradient pieces cross "
                    "the network,\nonce a step (FSDP1: ShardingStrategy.HYBRID_SHARD)")
        else:
            group(ax, -0.1, -0.1, node_w + 0.2, step + node_h + 0.05, "#D55E00", "")
            ax.text(node_w / 2, (node_h + step) / 2, f"one shard group of all {world} ranks: "
                    "its all-gathers and reduce-scatters cross the network", ha="center",
                    va="center", fontsize=7.5, color="#D55E00")
            ax.set_title(f"FSDP: fully_shard on a 1-D mesh of all {world} ranks\nevery rank "
                         "holds a different piece", fontsize=9.5)
            note = (f"a rank keeps 1/{world} of the model: the least memory; the common "
                    "default,\nalso across nodes")
        ax.text(0, -0.45, note, fontsize=8, va="top")
        ax.set_xlim(-0.3, node_w + 0.3)
        ax.set_ylim(-1.3, step * (nodes - 1) + node_h + 0.3)
        ax.axis("off")
    fig.suptitle("Which ranks hold which piece (same colour: the same piece of every weight, "
                 "gradient and optimizer state)", fontsize=10)
    return finish(fig, path)

def lesson_figures() -> dict:
    """Lesson 8's figures, from the recorded runs beside them."""
    with open(RECORDED / "pipeline_events.json") as f:
        pipeline = json.load(f)
    return {
        "memory_vs_world_size.png": draw_memory_vs_world(),
        "memory_measured.png": draw_measured_memory(read_records(RECORDED /
                                                                 "memory_measured.jsonl")),
        "pipeline_timeline.png": draw_pipeline(pipeline["runs"]),
        "zero_stages.png": draw_zero_stages(),
        "tensor_parallel.png": draw_tensor_parallel(),
        "hsdp_mesh.png": draw_hsdp_mesh(),
    }
