"""Rank arithmetic and the one diagram function used by the readings, notebooks and scripts.

A job has N nodes with G GPUs each; every process drives k GPUs, so each node runs
P = G // k processes and the world size is W = N * P. Process g on node n has
local rank g and global rank R = n * P + g.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Process:
    """One process of a job: where it runs and which devices it drives."""

    global_rank: int
    node: int
    local_rank: int
    gpus: tuple[int, ...] = field(default=())  # GPU indices on its node; () for a CPU process
    label: str = ""  # optional extra text for the diagram (a pid, a device name)


def layout(nodes: int, gpus_per_node: int, gpus_per_process: int = 1) -> list[Process]:
    """Every process of an N x G job in which each process spans k GPUs, by global rank."""
    for name, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node),
                        ("gpus_per_process", gpus_per_process)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if gpus_per_node % gpus_per_process:
        raise ValueError(
            f"{gpus_per_node} GPUs per node cannot be split into processes of "
            f"{gpus_per_process} GPUs each"
        )
    per_node = gpus_per_node // gpus_per_process
    return [
        Process(
            global_rank=n * per_node + g,
            node=n,
            local_rank=g,
            gpus=tuple(range(g * gpus_per_process, (g + 1) * gpus_per_process)),
        )
        for n in range(nodes)
        for g in range(per_node)
    ]


def rank_table(processes: list[Process]) -> str:
    """A plain-text table of the processes, one row each, in global-rank order."""
    rows = [
        {
            "global rank": p.global_rank,
            "node": p.node,
            "local rank": p.local_rank,
            "GPUs": ",".join(map(str, p.gpus)) if p.gpus else "-",
        }
        for p in sorted(processes, key=lambda p: p.global_rank)
    ]
    from ddpcourse.report import format_table

    return format_table(rows)


# Colour-blind-safe palette (Okabe-Ito); process i gets colour i mod 8.
PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
           "#999999"]


def draw(processes: list[Process], gpus_per_node: int | None = None, title: str | None = None,
         ax=None):
    """Draw a job: one box per node, one cell per GPU, one coloured span per process.

    Each span is labelled with the process's global rank R and local rank L. Processes
    without GPUs (CPU jobs) get one cell each, labelled 'CPU'. Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Rectangle

    if not processes:
        raise ValueError("nothing to draw: the job has no processes")
    nodes = sorted({p.node for p in processes})
    cells_per_node = {}
    for n in nodes:
        on_node = [p for p in processes if p.node == n]
        used = max((max(p.gpus) + 1 for p in on_node if p.gpus), default=0)
        cpu_cells = sum(1 for p in on_node if not p.gpus)
        cells_per_node[n] = max(gpus_per_node or 0, used + cpu_cells)
    width = max(cells_per_node.values())
    per_row = min(len(nodes), 4 if width <= 4 else 2)
    rows = (len(nodes) + per_row - 1) // per_row
    node_w, node_h, gap = width + 0.6, 2.3, 0.5

    if ax is None:
        fig, ax = plt.subplots(figsize=(max(4.0, per_row * (node_w + gap) * 0.95),
                                        rows * (node_h + gap) * 0.95 + 0.4))
    else:
        fig = ax.figure
    for i, n in enumerate(nodes):
        x0 = (i % per_row) * (node_w + gap)
        y0 = (rows - 1 - i // per_row) * (node_h + gap)
        ax.add_patch(FancyBboxPatch((x0, y0), node_w, node_h,
                                    boxstyle="round,pad=0.02,rounding_size=0.15",
                                    facecolor="#f4f4f4", edgecolor="#333333", linewidth=1.2))
        ax.text(x0 + 0.2, y0 + node_h - 0.3, f"node {n}", fontsize=10, weight="bold", va="center")
        on_node = sorted((p for p in processes if p.node == n), key=lambda p: p.local_rank)
        next_free = max((max(p.gpus) + 1 for p in on_node if p.gpus), default=0)
        for p in on_node:
            if p.gpus:
                start, span, cell_text = min(p.gpus), len(p.gpus), [f"GPU {g}" for g in p.gpus]
            else:
                start, span, cell_text = next_free, 1, ["CPU"]
                next_free += 1
            colour = PALETTE[p.global_rank % len(PALETTE)]
            px = x0 + 0.3 + start
            ax.add_patch(Rectangle((px, y0 + 0.25), span, 1.55, facecolor=colour, alpha=0.35,
                                   edgecolor=colour, linewidth=2))
            for j, text in enumerate(cell_text):
                ax.add_patch(Rectangle((px + j + 0.08, y0 + 0.35), 0.84, 0.6, facecolor="white",
                                       edgecolor="#555555", linewidth=0.8))
                ax.text(px + j + 0.5, y0 + 0.65, text, ha="center", va="center", fontsize=7)
            caption = f"R{p.global_rank}  L{p.local_rank}"
            if p.label:
                caption += f"\n{p.label}"
            ax.text(px + span / 2, y0 + 1.4, caption, ha="center", va="center", fontsize=8)
    ax.set_xlim(-0.2, per_row * (node_w + gap))
    ax.set_ylim(-0.2, rows * (node_h + gap))
    ax.set_aspect("equal")
    ax.axis("off")
    world = len(processes)
    ax.set_title(title or f"{len(nodes)} node(s), world size {world}  "
                          "(R = global rank, L = local rank)", fontsize=10)
    fig.tight_layout()
    return fig


def lesson_figures() -> dict:
    """Lesson 1's figures: the two layouts of 2 nodes x 4 GPUs."""
    return {
        "two_nodes_one_gpu_per_process.png": draw(
            layout(2, 4, 1), gpus_per_node=4,
            title="2 nodes x 4 GPUs, 1 GPU per process: world size 8"),
        "two_nodes_two_gpus_per_process.png": draw(
            layout(2, 4, 2), gpus_per_node=4,
            title="2 nodes x 4 GPUs, 2 GPUs per process: world size 4"),
    }
