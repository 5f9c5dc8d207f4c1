"""Lesson 4's pictures: every collective before and after, the barrier, the ring all-reduce.

Drawn from the plain-Python model of the collectives in ddpcourse/collectives.py, which
scripts/lesson4_collectives.py checks against torch.distributed.
"""

from __future__ import annotations

from ddpcourse.collectives import (
    NOT_DEFINED,
    cells_of,
    describe,
    format_number,
    ring_allreduce_steps,
    simulate,
    starting_states,
)
from ddpcourse.topology import PALETTE

REDUCED = "#d9d9d9"
BOX, GAP, ROW = 1.0, 0.35, 1.25  # box width, gap between a rank's tensors, row height


def _state_width(state) -> float:
    if state is None or state == NOT_DEFINED:
        return 3.0
    return sum(len(chunk) for chunk in state) * BOX + GAP * (len(state) - 1)


def _draw_state(ax, state, x: float, y: float, like=None) -> None:
    from matplotlib.patches import Rectangle

    if state is None:
        ax.text(x + 0.1, y + 0.4, "(no buffer)", fontsize=8, color="#777777", style="italic",
                va="center")
        return
    if state == NOT_DEFINED:
        count = sum(len(c) for c in like) if like else 2
        for i in range(count):
            ax.add_patch(Rectangle((x + i * BOX + 0.05, y + 0.05), BOX - 0.1, 0.7,
                                   facecolor="white", edgecolor="#999999", hatch="///",
                                   linewidth=0.8))
        ax.text(x + count * BOX + 0.2, y + 0.4, "not defined", fontsize=8, color="#777777",
                style="italic", va="center")
        return
    for chunk in state:
        if len(state) > 1:
            ax.add_patch(Rectangle((x - 0.03, y + 0.0), len(chunk) * BOX + 0.06, 0.8,
                                   facecolor="none", edgecolor="#333333", linewidth=1.3))
        for cell in chunk:
            single = len(cell.sources) == 1
            colour = PALETTE[next(iter(cell.sources)) % len(PALETTE)] if single else REDUCED
            ax.add_patch(Rectangle((x + 0.05, y + 0.05), BOX - 0.1, 0.7, facecolor=colour,
                                   alpha=0.55 if single else 1.0, edgecolor="#444444",
                                   linewidth=0.8))
            ax.text(x + BOX / 2, y + 0.4, format_number(cell), ha="center", va="center",
                    fontsize=8, weight="normal" if single else "bold")
            x += BOX
        x += GAP


def draw(name: str, world_size: int = 4, root: int = 0, op: str = "sum"):
    """Before and after `name` on `world_size` ranks: one row per rank. Returns the Figure."""
    import matplotlib.pyplot as plt

    if name == "barrier":
        return draw_barrier(world_size)
    before = [cells_of(s, r) for r, s in enumerate(starting_states(name, world_size, root))]
    after = simulate(name, before, root=root, op=op)
    left = max(_state_width(s) for s in before)
    right = max(_state_width(s) for s in after) + (3.0 if NOT_DEFINED in after else 0)
    x_after = left + 2.2
    total = x_after + right
    fig, ax = plt.subplots(figsize=(max(6.0, (total + 2.2) * 0.42), (world_size + 2.2) * 0.55))
    top = world_size * ROW
    for r in range(world_size):
        y = top - (r + 1) * ROW
        ax.text(-0.3, y + 0.4, f"rank {r}", ha="right", va="center", fontsize=9, weight="bold",
                color=PALETTE[r % len(PALETTE)] if r % len(PALETTE) != 3 else "#8a7d00")
        _draw_state(ax, before[r], 0.0, y)
        _draw_state(ax, after[r], x_after, y, like=after[root] if after[root] else None)
    ax.annotate("", xy=(x_after - 0.5, top / 2), xytext=(left + 0.4, top / 2),
                arrowprops={"arrowstyle": "-|>", "lw": 2, "color": "#333333"})
    ax.text(0, top + 0.15, "before", fontsize=10, weight="bold")
    ax.text(x_after, top + 0.15, "after", fontsize=10, weight="bold")
    call, says = describe(name, root, op)
    ax.set_title(f"{call}\n{says}", fontsize=10)
    ax.text(-2.0, -0.45, "colour: the rank a value came from;  grey: combined from several ranks",
            fontsize=7.5, color="#555555")
    ax.set_xlim(-2.1, total + 0.3)
    ax.set_ylim(-0.7, top + 0.7)
    ax.axis("off")
    fig.tight_layout()
    return fig


def draw_barrier(world_size: int = 4, arrivals: list[float] | None = None):
    """A timeline: each rank works, then waits in the barrier until the last one arrives."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    arrivals = arrivals or [1.0 + ((3 * r + 1) % (world_size + 1)) * 0.6
                            for r in range(world_size)]
    last = max(arrivals)
    end = last + 1.2
    fig, ax = plt.subplots(figsize=(7.5, (world_size + 2) * 0.55))
    for r, t in enumerate(arrivals):
        y = world_size - 1 - r
        colour = PALETTE[r % len(PALETTE)]
        ax.add_patch(Rectangle((0, y + 0.15), t, 0.7, facecolor=colour, alpha=0.55,
                               edgecolor="#444444"))
        if t < last:
            ax.add_patch(Rectangle((t, y + 0.15), last - t, 0.7, facecolor="white",
                                   edgecolor="#999999", hatch="///"))
        ax.add_patch(Rectangle((last, y + 0.15), end - last, 0.7, facecolor=colour, alpha=0.3,
                               edgecolor="#444444"))
        ax.text(-0.1, y + 0.5, f"rank {r}", ha="right", va="center", fontsize=9, weight="bold")
        ax.text(t / 2, y + 0.5, "work", ha="center", va="center", fontsize=8)
        if last - t > 0.9:
            ax.text((t + last) / 2, y + 0.5, "waits in barrier", ha="center", va="center",
                    fontsize=8, color="#555555", bbox={"facecolor": "white", "lw": 0, "pad": 1})
    ax.axvline(last, color="#333333", linestyle="--", linewidth=1.2)
    ax.text(last + 0.05, world_size + 0.05, "the last rank arrives: everyone leaves together",
            fontsize=8, va="bottom")
    ax.set_xlim(-1.1, end + 0.2)
    ax.set_ylim(-0.3, world_size + 0.6)
    ax.set_xlabel("time")
    ax.set_yticks([])
    ax.set_xticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    call, says = describe("barrier")
    ax.set_title(f"{call}\n{says}", fontsize=10)
    fig.tight_layout()
    return fig


def _contributors(ranks: frozenset, world_size: int) -> str:
    if len(ranks) == world_size:
        return "all"
    return "+".join(str(r) for r in sorted(ranks))


def draw_ring_allreduce(world_size: int = 4):
    """The ring all-reduce of W chunks, stage by stage: which ranks' data each chunk holds.

    Two rows of panels: the start and the W-1 reduce-scatter steps, then the W-1 all-gather
    steps. In each panel a row is a rank and a box is one of the W chunks of its tensor.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    stages = ring_allreduce_steps(world_size)
    w = world_size
    panel_w, panel_h = w * BOX + 1.3, w * ROW + 1.4
    fig, ax = plt.subplots(figsize=(max(10.0, w * panel_w * 0.52 + 1.0), 2 * panel_h * 0.5 + 1.2))
    for s, stage in enumerate(stages):
        row, col = (0, s) if s < w else (1, s - w + 1)
        x0, y0 = col * panel_w, (1 - row) * panel_h
        ax.text(x0 + w * BOX / 2, y0 + w * ROW + 0.15, stage["label"], ha="center",
                fontsize=8.5, weight="bold")
        for r in range(w):
            y = y0 + (w - 1 - r) * ROW
            for c in range(w):
                ranks = stage["held"][r][c]
                done = len(ranks) == w
                if done:
                    face, alpha = "#2f7d32", 0.85
                elif len(ranks) == 1:
                    face, alpha = PALETTE[next(iter(ranks)) % len(PALETTE)], 0.45
                else:
                    face, alpha = REDUCED, 1.0
                received = stage["received"][r] == c
                ax.add_patch(Rectangle((x0 + c * BOX + 0.05, y + 0.05), BOX - 0.1, 0.75,
                                       facecolor=face, alpha=alpha,
                                       edgecolor="#000000" if received else "#777777",
                                       linewidth=2.2 if received else 0.7))
                ax.text(x0 + c * BOX + BOX / 2, y + 0.42, _contributors(ranks, w), ha="center",
                        va="center", fontsize=7 if w <= 4 else 5,
                        color="white" if done else "black")
            if col == 0 or (row == 1 and col == 1):
                ax.text(x0 - 0.15, y + 0.42, f"rank {r}", ha="right", va="center", fontsize=8,
                        weight="bold")
    ax.text(-1.6, panel_h + w * ROW + 0.75, "reduce-scatter: each rank adds the chunk it "
            "receives to its own; after W-1 steps rank r holds the full sum of chunk r+1",
            fontsize=8.5, style="italic")
    ax.text(-1.6, w * ROW + 0.85, "all-gather: each rank passes finished chunks on, "
            "overwriting its own copy; after W-1 more steps every rank has every sum",
            fontsize=8.5, style="italic")
    ax.set_title(f"ring all-reduce on {w} ranks: the tensor is cut into {w} chunks (boxes); in "
                 "every step each rank sends one chunk to rank+1\n"
                 "text: the ranks summed into the chunk; thick border: received in this step; "
                 "green: complete", fontsize=9)
    ax.set_xlim(-1.7, w * panel_w)
    ax.set_ylim(-0.2, 2 * panel_h + 0.3)
    ax.axis("off")
    fig.tight_layout()
    return fig


FIGURE_ORDER = ["broadcast", "reduce", "all_reduce", "gather", "all_gather", "scatter",
                "reduce_scatter", "send_recv", "barrier"]


def lesson_figures(world_size: int = 4) -> dict:
    """{file name: Figure} for every collective, plus the ring all-reduce."""
    figures = {f"{name}.png": draw(name, world_size) for name in FIGURE_ORDER}
    figures["ring_allreduce.png"] = draw_ring_allreduce(world_size)
    return figures
