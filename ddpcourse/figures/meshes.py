"""Lesson 10's pictures: the device mesh in two and three dimensions, ring attention's blocks
going round the ranks, and expert parallelism's all-to-all there and back.

All four are diagrams, drawn from nothing but the rules they show (no recorded run): the
row-major layout of init_device_mesh (rank = sum of coordinate x stride), the ring's hops
(rank r holds key block (r - h) mod W after h hops), the causal mask's blocks, and the
split sizes of an all_to_all_single computed from the tokens' experts.
"""

from __future__ import annotations

from ddpcourse.figures import finish, pyplot
from ddpcourse.topology import PALETTE

ROW_COLOUR = "#0072B2"     # a row of a 2-D mesh: the tp group (blue, solid outline)
COLUMN_COLOUR = "#D55E00"  # a column: the dp group (vermillion, dashed outline)
PP_COLOURS = [PALETTE[i] for i in (0, 1, 2, 3, 6, 7)]   # one per (dp, tp) position: the pp groups
GREY = "#dddddd"



def _box(ax, x, y, w, h, colour, text="", alpha=0.75, fontsize=8, edge="#333333", lw=0.8,
         hatch=None, zorder=1, **kwargs):
    """A rectangle with its lower left corner at (x, y), and text in its middle."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, alpha=alpha, edgecolor=edge,
                           lw=lw, hatch=hatch, zorder=zorder))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize,
                zorder=zorder + 1, **kwargs)


def _outline(ax, x, y, w, h, colour, dashed=False, lw=2.0):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03,rounding_size=0.12",
                                facecolor="none", edgecolor=colour, lw=lw,
                                ls="--" if dashed else "-"))


def _arrow(ax, start, end, colour="#333333", rad=0.0, lw=1.3, style="-|>", scale=11,
           zorder=1):
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=scale, lw=lw,
                                 color=colour, connectionstyle=f"arc3,rad={rad}",
                                 zorder=zorder))


def mesh_coordinates(rank: int, shape) -> tuple[int, ...]:
    """Where `rank` sits in a mesh of `shape`, row-major (the last dimension changes fastest),
    the order init_device_mesh writes the ranks in. Used only to draw."""
    coordinates = []
    for size in reversed(shape):
        coordinates.append(rank % size)
        rank //= size
    return tuple(reversed(coordinates))


# --- (a) a 2-D mesh --------------------------------------------------------------------------

CELL, GAP = 1.3, 0.5   # a rank's square, the space between two


def _grid(ax, x0, y0, dp, tp, first_rank=0, fills=None, label=True):
    """A dp x tp grid of ranks with its lower left corner at (x0, y0), row 0 on top; each row
    outlined (tp group), each column outlined dashed (dp group). Returns {(d, t): centre}."""
    centres = {}
    step = CELL + GAP
    for d in range(dp):
        for t in range(tp):
            x, y = x0 + t * step, y0 + (dp - 1 - d) * step
            rank = first_rank + d * tp + t
            fill = fills[(d, t)] if fills else "#f3f3f3"
            _box(ax, x, y, CELL, CELL, fill, alpha=0.55 if fills else 1.0)
            ax.text(x + CELL / 2, y + CELL * 0.62, f"R{rank}", ha="center", va="center",
                    fontsize=12, fontweight="bold")
            if label:
                ax.text(x + CELL / 2, y + CELL * 0.27, f"({d}, {t})", ha="center",
                        va="center", fontsize=8.5, color="#333333")
            centres[(d, t)] = (x + CELL / 2, y + CELL / 2)
    for d in range(dp):   # rows: the tp groups
        y = y0 + (dp - 1 - d) * step
        _outline(ax, x0 - 0.1, y - 0.1, tp * step - GAP + 0.2, CELL + 0.2, ROW_COLOUR)
    for t in range(tp):   # columns: the dp groups
        x = x0 + t * step
        _outline(ax, x - 0.17, y0 - 0.17, CELL + 0.34, dp * step - GAP + 0.34, COLUMN_COLOUR,
                 dashed=True, lw=1.6)
    return centres


def draw_mesh_2d(dp: int = 2, tp: int = 2, path: str | None = None):
    """W = dp x tp ranks written row by row into a grid, as init_device_mesh(device, (dp, tp),
    mesh_dim_names=("dp", "tp")) lays them out: rank = dp_c x tp + tp_c. Each row (same dp
    coordinate) is a tp group, each column (same tp coordinate) a dp group."""
    plt = pyplot(path)
    step = CELL + GAP
    grid_w, grid_h = tp * step - GAP, dp * step - GAP
    fig, ax = plt.subplots(figsize=(4.2 + grid_w * 0.95 + 0.3, max(3.4, grid_h * 0.95 + 1.6)))
    _grid(ax, 0.9, 0.4, dp, tp)
    for d in range(dp):   # the dp coordinate of each row, on its left
        ax.text(0.55, 0.4 + (dp - 1 - d) * step + CELL / 2, f"dp_c = {d}", ha="right",
                va="center", fontsize=8.5, color=ROW_COLOUR)
    for t in range(tp):   # the tp coordinate of each column, above it
        ax.text(0.9 + t * step + CELL / 2, 0.4 + grid_h + 0.3, f"tp_c = {t}", ha="center",
                va="bottom", fontsize=8.5, color=COLUMN_COLOUR)
    world = dp * tp
    rows = ", ".join("{" + ", ".join(str(d * tp + t) for t in range(tp)) + "}"
                     for d in range(dp))
    columns = ", ".join("{" + ", ".join(str(d * tp + t) for d in range(dp)) + "}"
                        for t in range(tp))
    last = (dp - 1, tp - 1)
    x_text = 0.9 + grid_w + 0.6
    top = 0.4 + grid_h
    ax.text(x_text, top, f"W = {world} = dp x tp = {dp} x {tp}, row-major:\n"
            "rank = dp_c x tp + tp_c", fontsize=10, va="top", fontweight="bold")
    ax.text(x_text, top - 0.95, f"e.g. ({last[0]}, {last[1]}): {last[0]} x {tp} + {last[1]}"
            f" = {world - 1}", fontsize=9, va="top")
    ax.text(x_text, top - 1.45, f"rows (solid), the tp groups (same dp_c):\n{rows}", fontsize=9,
            va="top", color=ROW_COLOUR)
    ax.text(x_text, top - 2.25, f"columns (dashed), the dp groups (same tp_c):\n{columns}",
            fontsize=9, va="top", color=COLUMN_COLOUR)
    ax.set_xlim(-0.4, x_text + 3.6)
    ax.set_ylim(min(0.0, top - 3.0), top + 0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"A {dp} x {tp} device mesh (dp, tp): R = rank, (dp_c, tp_c) = its "
                 "coordinates", fontsize=10)
    return finish(fig, path)


# --- (b) a 3-D mesh --------------------------------------------------------------------------

def draw_mesh_3d(pp: int = 2, dp: int = 2, tp: int = 2, path: str | None = None):
    """W = pp x dp x tp ranks, row-major: rank = pp_c x dp x tp + dp_c x tp + tp_c. One
    dp x tp grid per pipeline stage, side by side; the ranks with the same (dp_c, tp_c) in
    every stage form a pp group (same colour), linked stage to stage."""
    plt = pyplot(path)
    step = CELL + GAP
    grid_w, grid_h = tp * step - GAP, dp * step - GAP
    stage_gap = 2.6
    positions = [(d, t) for d in range(dp) for t in range(tp)]
    fills = {p: PP_COLOURS[i % len(PP_COLOURS)] for i, p in enumerate(positions)}
    fig, ax = plt.subplots(figsize=(pp * (grid_w + stage_gap) * 0.95 + 0.6,
                                    grid_h * 0.95 + 3.4))
    y0 = 1.6
    centres = []
    for s in range(pp):
        x0 = s * (grid_w + stage_gap)
        ax.text(x0 + grid_w / 2, y0 + grid_h + 0.45, f"stage {s} (pp_c = {s})\nranks "
                f"{s * dp * tp}-{(s + 1) * dp * tp - 1}", ha="center", va="bottom",
                fontsize=9.5, fontweight="bold")
        centres.append(_grid(ax, x0, y0, dp, tp, first_rank=s * dp * tp, fills=fills))
    for s in range(pp - 1):   # the pp groups: the same position in neighbouring stages
        x1 = s * (grid_w + stage_gap) + grid_w + 0.3
        x2 = (s + 1) * (grid_w + stage_gap) - 0.3
        for p in positions:
            d, t = p
            y = centres[s][p][1] + (0.3 - 0.6 * t / (tp - 1) if tp > 1 else 0.0)
            _arrow(ax, (x1, y), (x2, y), colour=fills[p], lw=2.2, style="<|-|>")
            ax.text((x1 + x2) / 2, y + 0.05, f"R{s * dp * tp + d * tp + t} - "
                    f"R{(s + 1) * dp * tp + d * tp + t}", ha="center", va="bottom",
                    fontsize=7.5)
    world = pp * dp * tp
    groups = ["{" + ", ".join(str(s * dp * tp + d * tp + t) for s in range(pp)) + "}"
              for d, t in positions]
    ax.text(0, 0.9, f"W = {world} = pp x dp x tp = {pp} x {dp} x {tp}, row-major: rank = "
            "pp_c x dp x tp + dp_c x tp + tp_c;  coordinates (dp_c, tp_c) inside a stage",
            fontsize=9, va="top")
    ax.text(0, 0.4, "pp groups (same dp_c, tp_c; same colour, the arrows: activations "
            f"forward, their gradients back): {', '.join(groups)}\n"
            "in a stage: rows (solid) are tp groups, columns (dashed) dp groups, as in the "
            "2-D mesh", fontsize=9, va="top")
    ax.set_xlim(-0.5, pp * (grid_w + stage_gap) - stage_gap + 0.5)
    ax.set_ylim(-0.6, y0 + grid_h + 1.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"A {pp} x {dp} x {tp} mesh (pp, dp, tp): one {dp} x {tp} (dp, tp) grid "
                 "per pipeline stage", fontsize=10)
    return finish(fig, path)


# --- (c) ring attention ----------------------------------------------------------------------

def block_state(query_block: int, key_block: int, causal: bool) -> str:
    """What a query block does with a key block: 'computed', 'diagonal' (computed, the causal
    mask inside it) or 'skipped' (every key after every query)."""
    if not causal or key_block < query_block:
        return "computed"
    return "diagonal" if key_block == query_block else "skipped"


def draw_ring_attention(world_size: int = 4, causal: bool = True, path: str | None = None):
    """Left: W ranks on a ring, rank r keeping its query block Q_r while the K/V blocks travel
    r -> r + 1, W - 1 hops. Right: the W x W blocks of the score matrix (query block rows, key
    block columns), each with the hop at which its key block reaches the query's rank,
    (r - c) mod W; with a causal mask the blocks above the diagonal are skipped."""
    import math

    plt = pyplot(path)
    w = world_size
    fig, (ring, grid) = plt.subplots(1, 2, figsize=(12, 5.6),
                                     gridspec_kw={"width_ratios": [1.05, 1]})
    radius = 2.2
    spots = [(radius * math.sin(2 * math.pi * r / w), radius * math.cos(2 * math.pi * r / w))
             for r in range(w)]
    for r, (x, y) in enumerate(spots):
        _box(ring, x - 0.7, y - 0.45, 1.4, 0.9, PALETTE[r % len(PALETTE)], alpha=0.5)
        ring.text(x, y + 0.2, f"rank {r}", ha="center", va="center", fontsize=9.5,
                  fontweight="bold")
        ring.text(x, y - 0.17, f"Q{r}; K{r}, V{r}", ha="center", va="center", fontsize=9)
    if w > 1:
        for r in range(w):
            (x1, y1), (x2, y2) = spots[r], spots[(r + 1) % w]
            length = math.hypot(x2 - x1, y2 - y1)
            shrink = 0.85 / length if w > 2 else 0.3
            start = (x1 + (x2 - x1) * shrink, y1 + (y2 - y1) * shrink)
            end = (x2 - (x2 - x1) * shrink, y2 - (y2 - y1) * shrink)
            _arrow(ring, start, end, "#333333", rad=-0.25, lw=1.6, scale=14)
    ring.text(0, 0, "K, V blocks\ntravel\nr -> r + 1", ha="center", va="center",
              fontsize=9)
    ring.text(0, -radius - 0.75, f"each hop: every rank sends the K, V block it holds to "
              f"rank + 1\nand receives rank - 1's; after h hops rank r holds block (r - h) "
              f"mod {w}.\n{w - 1} hops: every K, V block visits every rank once. Q stays "
              "home,\nand no rank ever holds the whole score matrix: the online\nsoftmax "
              "merges one block's scores at a time", ha="center", va="top", fontsize=8.5)
    ring.set_xlim(-radius - 1.3, radius + 1.3)
    ring.set_ylim(-radius - 2.6, radius + 0.7)
    ring.set_aspect("equal")
    ring.axis("off")
    ring.set_title(f"{w} ranks, the sequence cut into {w} blocks: rank r keeps Q_r",
                   fontsize=9.5)

    fills = {"computed": PALETTE[2], "diagonal": PALETTE[3], "skipped": "white"}
    counts = {}
    for r in range(w):          # query block: a row, 0 on top
        for c in range(w):      # key block: a column
            state = block_state(r, c, causal)
            counts[state] = counts.get(state, 0) + 1
            hop = (r - c) % w
            _box(grid, c, w - 1 - r, 1, 1, fills[state], alpha=0.8 if state != "skipped" else 1,
                 hatch="///" if state == "skipped" else None,
                 edge="#999999" if state == "skipped" else "#333333")
            text = f"hop {hop}" + ("\nskipped" if state == "skipped" else "")
            grid.text(c + 0.5, w - 1 - r + 0.5, text, ha="center", va="center",
                      fontsize=8 if w <= 6 else 6.5,
                      color="#777777" if state == "skipped" else "black",
                      bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5,
                            "alpha": 0.85} if state == "skipped" else None)
    grid.set_xticks([c + 0.5 for c in range(w)], [f"K{c}" for c in range(w)])
    grid.set_yticks([w - 1 - r + 0.5 for r in range(w)],
                    [f"Q{r} (rank {r})" for r in range(w)])
    grid.tick_params(length=0)
    grid.xaxis.tick_top()
    grid.set_xlim(-0.03, w + 0.03)   # the outer cells' edges whole
    grid.set_ylim(-0.03, w + 0.03)
    grid.set_aspect("equal")
    for spine in grid.spines.values():
        spine.set_visible(False)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=fills["computed"], edgecolor="#333333", alpha=0.8,
                     label=f"computed ({counts.get('computed', 0)})")]
    if causal:
        handles += [Patch(facecolor=fills["diagonal"], edgecolor="#333333", alpha=0.8,
                          label=f"diagonal: computed, masked inside ({counts['diagonal']})"),
                    Patch(facecolor="white", edgecolor="#999999", hatch="///",
                          label=f"skipped: all keys after all queries ({counts['skipped']})")]
    grid.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=1,
                fontsize=8.5, frameon=False)
    work = "rank r computes r + 1 blocks: the last rank works most" if causal else \
        "every rank computes all its blocks"
    grid.set_title(f"{'causal' if causal else 'full'} attention: query blocks (rows) x key "
                   f"blocks (columns)\nhop h: key block c reaches rank r after h = (r - c) "
                   f"mod {w} hops\n{work}", fontsize=9.5, pad=22)
    fig.suptitle("Ring attention (context parallelism): queries stay, keys and values go round",
                 fontsize=10.5)
    return finish(fig, path)


# --- (d) expert parallelism ------------------------------------------------------------------

EXAMPLE_EXPERTS = ((0, 4, 1, 4, 5, 2, 0, 4), (3, 4, 0, 5, 4, 1, 4, 3), (1, 4, 5, 0, 3, 4, 2, 5))


def send_counts(expert_ids, num_experts: int, world_size: int) -> list[list[int]]:
    """counts[s][d]: the rows rank s sends rank d, whose experts are d E/W to (d+1) E/W - 1:
    the input split sizes of rank s's all_to_all_single (and column d, the output split
    sizes of rank d's)."""
    per_rank = num_experts // world_size
    return [[sum(1 for e in ids if e // per_rank == d) for d in range(world_size)]
            for ids in expert_ids]


def draw_moe_dispatch(expert_ids=EXAMPLE_EXPERTS, num_experts: int = 6,
                      path: str | None = None):
    """Expert parallelism on W = len(expert_ids) ranks, E experts, E / W per rank: each rank's
    tokens coloured by their expert; sorted by expert (destination rank); the all_to_all_single
    that sends each run of rows to its expert's rank, with uneven split sizes; the experts'
    outputs come back by the same all_to_all with the split sizes swapped, then unsorted."""
    plt = pyplot(path)
    w = len(expert_ids)
    if num_experts % w:
        raise ValueError(f"{num_experts} experts do not split over {w} ranks")
    per_rank = num_experts // w
    colours = [PALETTE[e % len(PALETTE)] for e in range(num_experts)]
    counts = send_counts(expert_ids, num_experts, w)
    received = [[(s, e) for s in range(w) for e in sorted(expert_ids[s]) if e // per_rank == d]
                for d in range(w)]
    size, sep, row_h = 0.42, 0.14, 1.5   # a token's square, between two runs, between ranks
    tokens = max(len(ids) for ids in expert_ids)
    most = max(len(rows) for rows in received)
    col_x = [0.0, tokens * size + 1.4]
    col_x.append(col_x[1] + tokens * size + w * sep + 3.2)
    col_x.append(col_x[2] + most * size + w * sep + 3.4)
    right = col_x[3] + tokens * size
    height = w * row_h
    fig, ax = plt.subplots(figsize=((right + 2.0) * 0.8, height * 0.8 + 2.9))

    def token(x, y, expert, text=None, alpha=1.0):
        _box(ax, x, y, size * 0.92, size * 0.92, colours[expert], str(expert) if text is None
             else text, alpha=alpha, fontsize=7.5, zorder=3)   # above the arrows: they
        # leave a run's end and pass under the runs after it

    def top(rank):
        return (w - 1 - rank) * row_h

    segments = {}
    for s, ids in enumerate(expert_ids):
        y = top(s)
        ax.text(-0.25, y + size / 2, f"rank {s}\nexperts {s * per_rank}-"
                f"{(s + 1) * per_rank - 1}", ha="right", va="center", fontsize=8.5)
        for i, e in enumerate(ids):                     # as they are
            token(col_x[0] + i * size, y, e)
        x = col_x[1]                                    # 1. sorted by expert
        for d in range(w):
            run = [e for e in sorted(ids) if e // per_rank == d]
            for i, e in enumerate(run):
                token(x + i * size, y, e)
            if run:
                ax.text(x + len(run) * size / 2 - 0.02, y - 0.1, f"to {d}: {len(run)}",
                        ha="center", va="top", fontsize=7, color="#333333", zorder=4,
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3})
            segments[(s, d)] = (x, len(run))
            x += len(run) * size + (sep if run else 0)
        for i, e in enumerate(ids):                     # 5. back, in place
            token(col_x[3] + i * size, y, e, text=f"{e}'", alpha=0.45)
    for d, rows in enumerate(received):                 # 3. on the experts' rank
        y = top(d)
        x = col_x[2]
        for s in range(w):
            run = [e for source, e in rows if source == s]
            for i, e in enumerate(run):
                token(x + i * size, y, e)
            if run:   # from the middle of the run sent (under it) to this run's edge
                start, n = segments[(s, d)]
                centre = x + len(run) * size / 2 - 0.02
                below = s >= d   # from a rank below, or this rank itself (arcing under)
                _arrow(ax, (start + n * size / 2, top(s) + size / 2),
                       (centre, y - 0.04 if below else y + size + 0.02),
                       colour="#555555", lw=0.9, zorder=2, rad=0.12 if s == d else 0.0)
            x += len(run) * size + (sep if run else 0)
        ax.text(x + 0.05, y + size / 2, f"{len(rows)} rows", ha="left", va="center",
                fontsize=8, fontweight="bold")
    back_x = col_x[2] + most * size + w * sep + 1.15   # the return trip, one wide arrow
    _arrow(ax, (back_x, height / 2 - 0.3), (col_x[3] - 0.2, height / 2 - 0.3),
           colour=COLUMN_COLOUR, lw=2.5, scale=16)
    ax.text((back_x + col_x[3]) / 2 - 0.1, height / 2 - 0.15, "all_to_all_single\nback (splits\n"
            "swapped),\nunsort", ha="center", va="bottom", fontsize=7.5, color=COLUMN_COLOUR)
    titles = ["tokens on each rank\n(colour, number: its expert)",
              "1. sorted by expert:\na run of rows per rank",
              "3. after all_to_all_single: on the experts'\n"
              "ranks, by source rank (4. the experts run)",
              "5. back in place:\ne' = expert e's output"]
    for x, title in zip(col_x, titles, strict=True):
        ax.text(x, height - 0.45, title, ha="left", va="bottom", fontsize=8.5,
                fontweight="bold")
    header = "        " + "".join(f"to {d:<3d}" for d in range(w))
    matrix = "\n".join(f"from {s:<3d}" + "".join(f"{c:<6d}" for c in row)
                       for s, row in enumerate(counts))
    ax.text(col_x[0], -0.6, "2. the send counts, exchanged first (an all_to_all_single of\n"
            "counts): the split sizes of step 3, uneven\n\n" + header + "\n" + matrix,
            ha="left", va="top", fontsize=8, family="monospace")
    ax.text(col_x[2], -0.6, "backward: the same trip in reverse (input and output split sizes "
            "swapped).\nNo capacity limit here: a popular expert's rank simply gets more rows",
            ha="left", va="top", fontsize=8.5)
    ax.set_xlim(-1.9, right + 0.2)
    ax.set_ylim(-1.2 - 0.33 * (w + 1), height + 0.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"Expert parallelism: {num_experts} experts over {w} ranks ({per_rank} each), "
                 "top-1 routing: all_to_all_single there and back", fontsize=10)
    return finish(fig, path)


def lesson_figures() -> dict:
    """Lesson 10's figures: diagrams only."""
    return {
        "mesh_2d.png": draw_mesh_2d(2, 2),
        "mesh_3d.png": draw_mesh_3d(2, 2, 2),
        "ring_attention.png": draw_ring_attention(3, causal=True),
        "moe_all_to_all.png": draw_moe_dispatch(),
    }

