"""Pictures of lesson 3: how DistributedSampler splits a dataset, and one DDP training step.

The sampler picture is drawn from what torch's own DistributedSampler returns (called with
explicit num_replicas and rank, so no process group is needed); the DDP step is a schematic
of the order of events, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpcourse.topology import PALETTE


@dataclass(frozen=True)
class SamplerSplit:
    """What DistributedSampler does with a dataset of `length` items in one epoch."""

    order: list[int]         # the epoch's order of the whole dataset (shuffled or not)
    padding: list[int]       # indices appended to the order so that it splits evenly
    dropped: list[int]       # indices cut from the end of the order (drop_last)
    shares: list[list[int]]  # shares[r]: the indices rank r reads, in its order


def sampler_split(length: int, world_size: int, shuffle: bool = True, seed: int = 0,
                  epoch: int = 0, drop_last: bool = False) -> SamplerSplit:
    """Ask DistributedSampler for every rank's share and explain it as order + padding."""
    import torch
    from torch.utils.data import DistributedSampler

    shares = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(length), num_replicas=world_size, rank=rank,
                                     shuffle=shuffle, seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        shares.append(list(sampler))
    if shuffle:
        order = torch.randperm(length, generator=torch.Generator().manual_seed(seed + epoch))
        order = order.tolist()
    else:
        order = list(range(length))
    # The sampler deals position p of the (padded or cut) order to rank p % world_size.
    dealt = [shares[p % world_size][p // world_size] for p in range(world_size * len(shares[0]))]
    kept = order[:len(dealt)]
    if dealt[:len(kept)] != kept:
        raise AssertionError("DistributedSampler no longer deals the order out round-robin")
    return SamplerSplit(order=order, padding=dealt[len(kept):], dropped=order[len(dealt):],
                        shares=shares)


def _box(ax, x, y, text, colour, hatch=None, faded=False, width=0.9, height=0.8):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), width, height, facecolor=colour, alpha=0.25 if faded else 0.6,
                           edgecolor="#555555", linewidth=0.8, hatch=hatch))
    ax.text(x + width / 2, y + height / 2, text, ha="center", va="center", fontsize=9,
            color="#777777" if faded else "black")


def draw_sampler(length: int = 10, world_size: int = 3, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, ax=None, drop_last: bool = False, title: str | None = None):
    """The epoch's order, the padding or the cut, and the share of every rank."""
    import matplotlib.pyplot as plt

    split = sampler_split(length, world_size, shuffle, seed, epoch, drop_last)
    per_rank = len(split.shares[0])
    total = len(split.order) + len(split.padding)
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(7.0, (total + 4) * 0.55), (world_size + 3) * 0.62))
    else:
        fig = ax.figure
    top = world_size + 1.4
    ax.text(-0.3, top + 0.4, "order", ha="right", va="center", fontsize=9, weight="bold")
    for p, index in enumerate(split.order):
        if p < world_size * per_rank:
            _box(ax, p, top, str(index), PALETTE[p % world_size % len(PALETTE)])
        else:
            _box(ax, p, top, str(index), "#bbbbbb", hatch="xx", faded=True)
    for k, index in enumerate(split.padding):
        p = len(split.order) + k
        _box(ax, p, top, str(index), PALETTE[p % world_size % len(PALETTE)], hatch="//")
    for p in range(max(total, len(split.order))):
        ax.text(p + 0.45, top + 1.05, str(p), ha="center", va="center", fontsize=7,
                color="#777777")
    ax.text(-0.3, top + 1.05, "position", ha="right", va="center", fontsize=7, color="#777777")
    for rank, share in enumerate(split.shares):
        y = world_size - 1 - rank
        colour = PALETTE[rank % len(PALETTE)]
        ax.text(-0.3, y + 0.4, f"rank {rank}", ha="right", va="center", fontsize=9,
                weight="bold", color=colour)
        padded = set(range(len(split.order), total))
        for k, index in enumerate(share):
            position = k * world_size + rank
            _box(ax, k * 1.1, y, str(index), colour, hatch="//" if position in padded else None)
        ax.text(per_rank * 1.1 + 0.2, y + 0.4, f"positions {rank}, {rank + world_size}, ...",
                va="center", fontsize=8, color="#555555")
    if split.padding:
        note = (f"{length} items do not split into {world_size} equal shares: the order is "
                f"padded with its own beginning ({len(split.padding)} repeated, hatched //)")
    elif split.dropped:
        note = (f"drop_last=True: the tail of the order is cut ({len(split.dropped)} item(s) "
                "not read this epoch, hatched xx)")
    else:
        note = f"{length} items split evenly: {per_rank} per rank"
    ax.text(-2.2, -0.7, note, fontsize=8, color="#555555", va="center")
    ax.set_xlim(-2.4, max(total, per_rank * 1.1 + 4.5) + 0.3)
    ax.set_ylim(-1.1, top + 1.5)
    ax.axis("off")
    what = "shuffled with seed + epoch" if shuffle else "in order"
    ax.set_title(title or f"DistributedSampler: {length} items, {world_size} ranks, {what}, "
                          f"drop_last={drop_last}", fontsize=10)
    fig.tight_layout()
    return fig


def draw_sampler_figure(length: int = 10, world_size: int = 3, seed: int = 0, epoch: int = 0):
    """Padding (the default) above, drop_last=True below, for the same shuffled order."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9.0, (world_size + 3) * 1.15))
    for ax, drop_last in zip(axes, (False, True), strict=True):
        draw_sampler(length, world_size, True, seed, epoch, ax=ax, drop_last=drop_last,
                     title=f"{length} items over {world_size} ranks, shuffled (seed {seed}, "
                           f"epoch {epoch}), drop_last={drop_last}")
    right = max(ax.get_xlim()[1] for ax in axes)
    for ax in axes:  # the same scale in both panels, so that positions line up
        ax.set_xlim(ax.get_xlim()[0], right)
    fig.tight_layout()
    return fig


def draw_ddp_step(world_size: int = 2, layers: int = 4):
    """A schematic of one DDP step: forward, backward with bucketed all-reduces, optimizer."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(11.0, 1.6 + world_size * 1.35))
    lane_h, gap = 0.5, 0.15
    forward_w, backward_w, step_w = 0.8, 0.9, 1.2
    sync_w = 0.95
    # Layers finish their gradients last-to-first; two layers make a bucket.
    buckets = [list(range(layers, 0, -1))[i:i + 2] for i in range(0, layers, 2)]
    start_backward = sync_w + layers * forward_w + 0.4
    ready = {}  # bucket -> x at which its last gradient is ready
    for b, bucket in enumerate(buckets):
        done = max(list(range(layers, 0, -1)).index(layer) for layer in bucket) + 1
        ready[b] = start_backward + done * backward_w
    allreduce_w = 1.5
    comm_end = max(ready[b] + allreduce_w for b in ready)
    backward_end = start_backward + layers * backward_w
    step_x = max(backward_end, comm_end) + 0.25

    def block(x, y, w, text, colour, alpha=0.55):
        ax.add_patch(Rectangle((x, y), w, lane_h, facecolor=colour, alpha=alpha,
                               edgecolor="#444444", linewidth=0.8))
        ax.text(x + w / 2, y + lane_h / 2, text, ha="center", va="center", fontsize=8)

    for rank in range(world_size):
        colour = PALETTE[rank % len(PALETTE)]
        y_compute = (world_size - 1 - rank) * (2 * lane_h + 3 * gap) + lane_h + gap
        y_comm = y_compute - lane_h - gap
        ax.text(-0.2, y_compute + lane_h / 2, f"rank {rank}\ncompute", ha="right", va="center",
                fontsize=9, color=colour, weight="bold")
        ax.text(-0.2, y_comm + lane_h / 2, "communication", ha="right", va="center", fontsize=8,
                color="#555555")
        block(0, y_comm, sync_w, "rank 0's\nbuffers", "#bbbbbb")
        for i in range(layers):
            block(sync_w + i * forward_w, y_compute, forward_w, f"fwd L{i + 1}", colour, 0.3)
        ax.text(sync_w + layers * forward_w + 0.2, y_compute + lane_h / 2, "loss", ha="center",
                va="center", fontsize=8)
        for i, layer in enumerate(range(layers, 0, -1)):
            block(start_backward + i * backward_w, y_compute, backward_w, f"bwd L{layer}",
                  colour, 0.6)
        for b, bucket in enumerate(buckets):
            names = ", ".join(f"L{layer}" for layer in bucket)
            block(ready[b], y_comm, allreduce_w, f"all-reduce\nbucket {b}: {names}", "#bbbbbb")
        block(step_x, y_compute, step_w, "optimizer\nstep", colour, 0.9)
    height = world_size * (2 * lane_h + 3 * gap)
    ax.vlines(list(ready.values()), -0.1, height, color="#999999", linestyle=":",
              linewidth=0.9)
    ax.annotate("", xy=(comm_end, -0.25), xytext=(ready[1], -0.25),
                arrowprops={"arrowstyle": "<->", "color": "#555555"})
    ax.text((ready[1] + comm_end) / 2, -0.4, "backward() returns when\nthe last bucket is summed",
            ha="center", va="top", fontsize=8, color="#555555")
    ax.text(0, -0.3, "grey: collectives DDP runs for you\ndotted: a bucket's last gradient "
            "is ready", ha="left", va="top", fontsize=8, color="#555555")
    ax.text(ready[0] + allreduce_w / 2, height + 0.05, "bucket 0 is summed while layers 2 and 1 "
            "still compute their gradients", ha="center", va="bottom", fontsize=8,
            color="#555555")
    ax.set_xlim(-1.9, step_x + step_w + 0.2)
    ax.set_ylim(-1.1, height + 0.45)
    ax.axis("off")
    ax.set_title(f"One DDP training step on {world_size} processes (schematic): the same "
                 "model, different data, the same averaged gradients", fontsize=10)
    fig.tight_layout()
    return fig


def lesson_figures() -> dict:
    return {"sampler_split.png": draw_sampler_figure(10, 3),
            "ddp_step.png": draw_ddp_step(2)}
