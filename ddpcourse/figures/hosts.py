"""Lesson 5's pictures: the course's separate hosts, and a hierarchical all-reduce.

`draw_hosts` draws what ddpcourse.cluster.hosts builds for a run: one network namespace per host,
each with its own loopback and an eth0 on the course's subnet, joined by veth pairs to a
bridge that lives in a switch namespace of its own, and nothing added to the machine's own
namespace. The names and addresses come from ddpcourse.cluster.hosts, so the picture and the code
cannot drift apart. `draw_hierarchical_allreduce` draws the three phases of an all-reduce
whose only network phase has 2(N-1) steps for N nodes instead of 2(W-1) for W processes.
"""

from __future__ import annotations

from ddpcourse.cluster import hosts as H
from ddpcourse.topology import PALETTE

NETWORK = "#0072B2"   # the hosts' network: veth cables and the bridge
SLOW = "#D55E00"      # a link between machines
FAST = "#009E73"      # links inside a machine (NVLink, PCIe)


def _box(ax, x, y, w, h, face, edge="#333333", width=1.2, style="round,pad=0.02,rounding_size=0.12",
         **kwargs):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=style, facecolor=face, edgecolor=edge,
                                linewidth=width, **kwargs))


def draw_hosts(count: int = 2, nproc: int = 1, link: str = "1gbit", run: str = "ddpc<pid>-0"):
    """The hosts of one `python -m ddpcourse.cluster.hosts run --hosts COUNT --nproc NPROC` run.

    Each host box shows its namespace's name, its two interfaces (lo and eth0 with its
    address) and the processes torchrun starts there; a veth pair joins its eth0 to port
    h<k> of the bridge br0 in the switch namespace. `link` ("" for none) labels the tbf
    shaping on both ends of every cable. Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    if not 1 <= count <= 6:
        raise ValueError("draw_hosts draws 1 to 6 hosts")
    host_w, host_h, gap = 3.5, 3.1, 0.45
    width = count * host_w + (count - 1) * gap
    total_w = max(width + 1.0, 8.6)
    left = (total_w - width) / 2
    fig, ax = plt.subplots(figsize=(max(8.0, total_w * 0.98), 6.4))

    # The machine and its own namespace, which the course leaves alone.
    _box(ax, 0, 0, total_w, 7.7, "#fbfbfb", edge="#777777", width=1.0, zorder=-2)
    ax.text(0.25, 7.42, "one Linux machine (one kernel, shared CPUs, memory and GPUs)",
            fontsize=10, weight="bold", va="center")
    _box(ax, 0.25, 0.2, total_w - 0.5, 0.75, "#eeeeee", edge="#999999", width=0.8)
    ax.text(total_w / 2, 0.575, "the machine's own namespace: nothing added to it; it cannot reach "
            f"{H.SUBNET}.x", ha="center", va="center", fontsize=8.5, color="#444444")

    # The hosts.
    port_y = 2.0
    for k in range(count):
        x0 = left + k * (host_w + gap)
        y0 = 4.0
        _box(ax, x0, y0, host_w, host_h, "#f4f4f4")
        ax.text(x0 + 0.15, y0 + host_h - 0.28, f"host{k}", fontsize=11, weight="bold",
                va="center")
        ax.text(x0 + host_w - 0.12, y0 + host_h - 0.28, f"netns {run}-h{k}", fontsize=7,
                va="center", ha="right", family="monospace", color="#444444")
        # its processes: the agent, then its workers
        rank0 = k * nproc
        ranks = ", ".join(f"R{r}" for r in range(rank0, rank0 + nproc))
        role = "rendezvous + store" if k == 0 else "joins host0"
        _box(ax, x0 + 0.15, y0 + 1.55, host_w - 0.3, 0.95, PALETTE[k % len(PALETTE)],
             alpha=0.3, edge=PALETTE[k % len(PALETTE)], width=1.5)
        ax.text(x0 + host_w / 2, y0 + 2.2, f"torchrun agent ({role})", ha="center",
                va="center", fontsize=8)
        ax.text(x0 + host_w / 2, y0 + 1.8, f"worker(s) {ranks}, GROUP_RANK={k}", ha="center",
                va="center", fontsize=8)
        # its interfaces
        _box(ax, x0 + 0.15, y0 + 0.2, 1.35, 1.05, "white", edge="#555555", width=0.8)
        ax.text(x0 + 0.825, y0 + 0.9, "lo", ha="center", va="center", fontsize=9,
                weight="bold")
        ax.text(x0 + 0.825, y0 + 0.5, "127.0.0.1\nthis host only", ha="center", va="center",
                fontsize=7)
        _box(ax, x0 + 1.65, y0 + 0.2, host_w - 1.8, 1.05, "white", edge=NETWORK, width=1.4)
        ex = x0 + 1.65 + (host_w - 1.8) / 2
        ax.text(ex, y0 + 0.9, H.HOST_IFACE, ha="center", va="center", fontsize=9,
                weight="bold", color=NETWORK)
        ax.text(ex, y0 + 0.5, f"{H.address(k)}/{H.PREFIX_LENGTH}", ha="center", va="center",
                fontsize=8, family="monospace")
        # the cable: a veth pair from eth0 down to the bridge port h<k>
        px = ex
        ax.plot([ex, px], [y0 + 0.2, port_y + 0.55], color=NETWORK, linewidth=2.2)
        ax.text(ex + 0.08, (y0 + port_y) / 2 + 0.3, "veth pair\n(a virtual cable)", fontsize=7.5,
                color=NETWORK, va="center")
        if link:
            ax.text(ex - 0.08, y0 - 0.3, f"tbf {link}:\nwhat host{k} sends", fontsize=7,
                    color=SLOW, ha="right", va="center")
            ax.text(ex - 0.45, port_y + 0.275, f"tbf {link}:\nwhat it receives", fontsize=7,
                    color=SLOW, ha="right", va="center")
        _box(ax, px - 0.35, port_y, 0.7, 0.55, "white", edge=NETWORK, width=1.2)
        ax.text(px, port_y + 0.275, f"h{k}", ha="center", va="center", fontsize=8,
                color=NETWORK)

    # The switch: a bridge in a namespace of its own.
    sx0, sx1 = left + 0.6, left + width - 0.6
    if count == 1:
        sx0, sx1 = left, left + host_w
    _box(ax, sx0 - 0.5, 1.15, sx1 - sx0 + 1.0, 1.55, "#e8f1f8", edge=NETWORK, width=1.0, zorder=-1)
    ax.plot([sx0, sx1], [1.75, 1.75], color=NETWORK, linewidth=3, zorder=1)
    for k in range(count):
        px = left + k * (host_w + gap) + 1.65 + (host_w - 1.8) / 2
        ax.plot([px, px], [1.75, port_y], color=NETWORK, linewidth=2, zorder=1)
    ax.text((sx0 + sx1) / 2, 1.45, f"switch: netns {run}-sw, bridge {H.BRIDGE}", ha="center",
            va="center", fontsize=8.5, color=NETWORK)

    ax.set_xlim(-0.1, total_w + 0.1)
    ax.set_ylim(-0.1, 7.8)
    ax.set_aspect("equal")
    ax.axis("off")
    shaped = f", every cable shaped to {link} each way" if link else ""
    ax.set_title(f"{count} separate hosts on one machine: network namespaces on a switch{shaped}",
                 fontsize=10.5)
    fig.tight_layout()
    return fig


def draw_hierarchical_allreduce(nodes: int = 2, gpus: int = 4):
    """The three phases of a hierarchical all-reduce on NODES x GPUS processes.

    The tensor is cut into GPUS shards. 1. reduce-scatter inside each node (fast links):
    local rank g ends with its node's sum of shard g. 2. all-reduce of the shards across the
    network: the processes of local rank g, one per node, sum shard g (GPUS all-reduces at
    once, each of 1/GPUS of the bytes). 3. all-gather inside each node: every process gets
    every summed shard. Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    if not (1 <= nodes <= 4 and 2 <= gpus <= 8):
        raise ValueError("draw_hierarchical_allreduce draws 1-4 nodes of 2-8 processes")
    world = nodes * gpus
    phases = [("1. reduce-scatter inside each node", "local rank g: its node's sum of shard g"),
              ("2. all-reduce of each shard across nodes",
               f"{gpus} all-reduces at once, one per local rank, over the network"),
              ("3. all-gather inside each node", "every process: every shard, summed")]
    cell, node_gap = 0.62, 0.55
    node_w = gpus * cell + 0.3
    node_h = 1.25
    panel_w = node_w + 0.6
    panel_h = nodes * node_h + (nodes - 1) * node_gap + 1.2
    fig, axes = plt.subplots(1, 3, figsize=(3 * panel_w * 1.08 + 0.4, panel_h * 1.0 + 0.5))

    def arrow(ax, a, b, colour, rad=0.0, width=1.4):
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle="<|-|>" if rad == 0 else "-|>",
                                     mutation_scale=8, color=colour, linewidth=width,
                                     connectionstyle=f"arc3,rad={rad}", shrinkA=2, shrinkB=2))

    for phase, (ax, (title, subtitle)) in enumerate(zip(axes, phases, strict=True)):
        centres = {}
        for n in range(nodes):
            y0 = panel_h - 1.0 - (n + 1) * node_h - n * node_gap
            _box(ax, 0.3, y0, node_w, node_h, "#f4f4f4")
            ax.text(0.42, y0 + node_h - 0.18, f"node {n}", fontsize=7.5, weight="bold",
                    va="center")
            for g in range(gpus):
                r = n * gpus + g
                cx = 0.45 + g * cell + cell / 2
                cy = y0 + 0.45
                centres[r] = (cx, cy)
                # What the process holds after this phase: its own gradient (its colour), its
                # node's sum of one shard (grey), that shard summed over all (dark), or all
                # shards summed over all (dark, "all").
                if phase == 0:
                    face, text, colour = "#9a9a9a", f"n{n} s{g}", "black"
                elif phase == 1:
                    face, text, colour = "#444444", f"all s{g}", "white"
                else:
                    face, text, colour = "#222222", "all", "white"
                _box(ax, cx - cell * 0.42, cy - 0.32, cell * 0.84, 0.64, face, edge="#111111",
                     width=0.8, style="round,pad=0.01,rounding_size=0.05")
                ax.text(cx, cy + 0.1, f"R{r}", ha="center", va="center", fontsize=7,
                        color=colour)
                ax.text(cx, cy - 0.14, text, ha="center", va="center", fontsize=5.5,
                        color=colour)
        for n in range(nodes):
            if phase in (0, 2):  # a ring inside the node, over its fast links
                for g in range(gpus):
                    a, b = centres[n * gpus + g], centres[n * gpus + (g + 1) % gpus]
                    arrow(ax, a, b, FAST, rad=-0.5 if g + 1 < gpus else -0.25, width=1.0)
        if phase == 1 and nodes > 1:  # local rank g of every node: one all-reduce per shard
            for g in range(gpus):
                for n in range(nodes - 1):  # drawn in the gap between two nodes: the network
                    x = centres[n * gpus + g][0]
                    top = panel_h - 1.0 - (n + 1) * node_h - n * node_gap  # node n's bottom
                    arrow(ax, (x, top), (x, top - node_gap), SLOW, width=1.6)
        ax.text(panel_w / 2, panel_h - 0.3, title, ha="center", va="center", fontsize=9,
                weight="bold")
        ax.text(panel_w / 2, panel_h - 0.62, subtitle, ha="center", va="center", fontsize=7,
                color=SLOW if phase == 1 else FAST)
        ax.set_xlim(0, panel_w + 0.2)
        ax.set_ylim(0, panel_h)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.suptitle(f"hierarchical all-reduce, {nodes} nodes x {gpus} processes (W = {world}), the "
                 f"tensor in {gpus} shards s0..s{gpus - 1}: what each process holds after each "
                 "phase (n = node's sum, all = sum of all)", fontsize=8.5)
    fig.tight_layout()
    return fig


def lesson_figures() -> dict:
    """Lesson 5's figures."""
    return {
        "separate_hosts.png": draw_hosts(2, nproc=1, link="1gbit"),
        "hierarchical_allreduce.png": draw_hierarchical_allreduce(2, 4),
    }
