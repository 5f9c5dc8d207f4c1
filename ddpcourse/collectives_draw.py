"""What each collective does to every rank's data: a model in plain Python, and its picture.

The model needs no process group: it moves numbers between lists, one list per rank. The
lesson 4 figures are drawn from it, and scripts/lesson4_collectives.py checks the real
collectives against it, so the pictures and torch.distributed cannot drift apart.

A rank's *state* is what it holds before or after the call:

    [[1, 2]]                one tensor (one chunk of numbers)
    [[1, 2], [11, 12]]      a list of tensors (gather's output, scatter's input, ...)
    None                    no buffer at all (gather's output on a rank that is not dst)
    NOT_DEFINED             a buffer whose contents the call does not define (reduce on non-dst)

The pictures number values so that the tens digit is the rank they came from: rank r starts
with 10r+1, 10r+2, ... (this works up to 9 ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpcourse.topology import PALETTE

NOT_DEFINED = "not defined"

# name -> (the call, as a student writes it; what it does, in one line)
COLLECTIVES = {
    "broadcast": ("dist.broadcast(x, src={root})",
                  "rank {root}'s tensor is copied into every rank's tensor"),
    "reduce": ("dist.reduce(x, dst={root}, op={OP})",
               "the element-wise {op} of every rank's tensor lands on rank {root} only"),
    "all_reduce": ("dist.all_reduce(x, op={OP})",
                   "every rank ends with the element-wise {op} of all the tensors"),
    "gather": ("dist.gather(x, gather_list, dst={root})",
               "rank {root} collects every rank's tensor, in rank order"),
    "all_gather": ("dist.all_gather(tensor_list, x)",
                   "every rank collects every rank's tensor, in rank order"),
    "scatter": ("dist.scatter(x, scatter_list, src={root})",
                "rank {root} hands piece i of its list to rank i"),
    "reduce_scatter": ("dist.reduce_scatter(x, input_list, op={OP})",
                       "piece i of every rank's list is combined ({op}) and lands on rank i"),
    "send_recv": ("dist.isend(x, dst=(rank+1) % W); dist.irecv(y, src=(rank-1) % W)",
                  "a ring shift: every rank sends to its right and receives from its left"),
    "barrier": ("dist.barrier()",
                "no data moves: every rank waits until the last one has arrived"),
}
OPS = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


@dataclass(frozen=True)
class Cell:
    """One number and the ranks whose data went into it."""

    value: float
    sources: frozenset


def rank_values(rank: int, count: int = 2, first: int = 1) -> list[float]:
    """The numbers rank `rank` starts with in the pictures: 10*rank + first, + first + 1, ..."""
    return [float(10 * rank + first + i) for i in range(count)]


def starting_states(name: str, world_size: int, root: int = 0) -> list:
    """What every rank holds before `name`, as the lesson's pictures and script set it up."""
    _check(name, world_size, root)
    if name == "scatter":
        pieces = [rank_values(root, 2, first=2 * i + 1) for i in range(world_size)]
        return [pieces if r == root else None for r in range(world_size)]
    if name == "reduce_scatter":
        return [[rank_values(r, 1, first=i + 1) for i in range(world_size)]
                for r in range(world_size)]
    if name == "barrier":
        return [None] * world_size
    return [[rank_values(r)] for r in range(world_size)]


def _check(name: str, world_size: int, root: int) -> None:
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(COLLECTIVES)}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be a positive int, got {world_size!r}")
    if not 0 <= root < world_size:
        raise ValueError(f"root {root} is not a rank of a world of {world_size}")
    if name == "send_recv" and world_size < 2:
        raise ValueError("send/recv needs at least two ranks")


def _cells(state, rank: int):
    if state is None or state == NOT_DEFINED:
        return state
    return [[v if isinstance(v, Cell) else Cell(float(v), frozenset({rank})) for v in chunk]
            for chunk in state]


def _combine(cells: list[Cell], op: str) -> Cell:
    values = [c.value for c in cells]
    if op in ("max", "min"):
        best = max(values) if op == "max" else min(values)
        sources = frozenset().union(*(c.sources for c in cells if c.value == best))
        return Cell(best, sources)
    if op == "sum":
        value = sum(values)
    elif op == "avg":
        value = sum(values) / len(values)
    elif op == "product":
        value = 1.0
        for v in values:
            value *= v
    else:
        raise ValueError(f"unknown reduction {op!r}; known: {', '.join(OPS)}")
    return Cell(value, frozenset().union(*(c.sources for c in cells)))


def _reduce_chunks(chunks: list[list[Cell]], op: str) -> list[Cell]:
    sizes = {len(c) for c in chunks}
    if len(sizes) != 1:
        raise ValueError(f"tensors of different sizes {sorted(sizes)} cannot be reduced")
    return [_combine([chunk[i] for chunk in chunks], op) for i in range(len(chunks[0]))]


def simulate(name: str, before: list, root: int = 0, op: str = "sum") -> list:
    """Every rank's state after collective `name`, given every rank's state before it.

    `before` holds one state per rank (see the module docstring); plain numbers are taken to
    come from the rank that holds them. Returns states made of Cells.
    """
    world = len(before)
    _check(name, world, root)
    if op not in OPS:
        raise ValueError(f"unknown reduction {op!r}; known: {', '.join(OPS)}")
    state = [_cells(s, r) for r, s in enumerate(before)]
    first = [s[0] if s else None for s in state]  # the one tensor of each rank, where it has one
    if name == "broadcast":
        return [[list(first[root])] for _ in range(world)]
    if name == "reduce":
        total = _reduce_chunks(first, op)
        return [[total] if r == root else NOT_DEFINED for r in range(world)]
    if name == "all_reduce":
        total = _reduce_chunks(first, op)
        return [[list(total)] for _ in range(world)]
    if name == "gather":
        return [[list(c) for c in first] if r == root else None for r in range(world)]
    if name == "all_gather":
        return [[list(c) for c in first] for _ in range(world)]
    if name == "scatter":
        pieces = state[root]
        if pieces is None or len(pieces) != world:
            raise ValueError(f"scatter needs a list of {world} tensors on rank {root}")
        return [[list(pieces[r])] for r in range(world)]
    if name == "reduce_scatter":
        if any(s is None or len(s) != world for s in state):
            raise ValueError(f"reduce_scatter needs a list of {world} tensors on every rank")
        return [[_reduce_chunks([state[q][r] for q in range(world)], op)]
                for r in range(world)]
    if name == "send_recv":
        return [[list(first[(r - 1) % world])] for r in range(world)]
    return [None] * world  # barrier


def values(states: list) -> list:
    """The numbers of some states (Cells -> floats), keeping None and NOT_DEFINED."""
    return [s if s is None or s == NOT_DEFINED else
            [[c.value if isinstance(c, Cell) else float(c) for c in chunk] for chunk in s]
            for s in states]


def format_values(state) -> str:
    """A state as a short string: '[1, 2]', '[1, 2] [11, 12]', '-' (no buffer)."""
    if state is None:
        return "-"
    if state == NOT_DEFINED:
        return NOT_DEFINED
    return " ".join("[" + ", ".join(_number(v) for v in chunk) + "]" for chunk in state)


def _number(v) -> str:
    v = v.value if isinstance(v, Cell) else float(v)
    return str(int(v)) if v == int(v) and abs(v) < 1e15 else f"{v:.4g}"


def describe(name: str, root: int = 0, op: str = "sum") -> tuple[str, str]:
    """(the call, what it does) for `name`, filled in with the root and the reduction."""
    call, says = COLLECTIVES[name]
    fields = {"root": root, "op": op, "OP": f"dist.ReduceOp.{OPS[op]}"}
    return call.format(**fields), says.format(**fields)


# --- ring all-reduce, step by step --------------------------------------------------------

def ring_allreduce_steps(world_size: int) -> list[dict]:
    """The ring all-reduce of a tensor cut into W chunks, one dict per stage.

    Each stage has a label, and per rank the set of ranks whose chunk c is summed into what
    it holds (`held[rank][c]`), plus the chunk every rank received in that step. Steps
    1..W-1 are the reduce-scatter phase, steps W..2W-2 the all-gather phase.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be a positive int, got {world_size!r}")
    w = world_size
    held = [[frozenset({r}) for _ in range(w)] for r in range(w)]
    stages = [{"label": "start", "held": [list(h) for h in held], "received": [None] * w}]
    for step in range(w - 1):  # reduce-scatter: rank r sends chunk r-step, adds chunk r-step-1
        sent = [held[r][(r - step) % w] for r in range(w)]
        received = []
        for r in range(w):
            c = (r - step - 1) % w
            held[r][c] = held[r][c] | sent[(r - 1) % w]
            received.append(c)
        stages.append({"label": f"reduce-scatter {step + 1}", "held": [list(h) for h in held],
                       "received": received})
    for step in range(w - 1):  # all-gather: rank r sends its finished chunk r+1-step onward
        sent = [held[r][(r + 1 - step) % w] for r in range(w)]
        received = []
        for r in range(w):
            c = (r - step) % w
            held[r][c] = sent[(r - 1) % w]
            received.append(c)
        stages.append({"label": f"all-gather {step + 1}", "held": [list(h) for h in held],
                       "received": received})
    return stages


# --- pictures ------------------------------------------------------------------------------

BOX, GAP, ROW = 1.0, 0.35, 1.25  # box width, gap between a rank's tensors, row height
REDUCED = "#d9d9d9"


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
            ax.text(x + BOX / 2, y + 0.4, _number(cell), ha="center", va="center",
                    fontsize=8, weight="normal" if single else "bold")
            x += BOX
        x += GAP


def draw(name: str, world_size: int = 4, root: int = 0, op: str = "sum"):
    """Before and after `name` on `world_size` ranks: one row per rank. Returns the Figure."""
    import matplotlib.pyplot as plt

    if name == "barrier":
        return draw_barrier(world_size)
    before = [_cells(s, r) for r, s in enumerate(starting_states(name, world_size, root))]
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
