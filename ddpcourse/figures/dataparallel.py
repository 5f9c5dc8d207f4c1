"""The picture of one nn.DataParallel training step, for lesson 2's reading and notebook.

One process drives all the GPUs. Time runs from left to right through the phases of a step,
one row per GPU: the batch and the model start on GPU 0, are copied out, computed on in
one thread per GPU, and everything comes back to GPU 0, which alone computes the loss and
updates the weights.
"""

from __future__ import annotations

from ddpcourse.topology import PALETTE

HOME, OTHERS, IDLE = PALETTE[5], PALETTE[1], "#eeeeee"  # GPU 0's extra work stands out


def _phases(gpus: int, batch: int) -> list[tuple[str, list[str], str, bool]]:
    """(title, text in each GPU's cell ('' = idle), arrow 'out', 'in' or '', GPU 0 only?).

    The last field says whether GPU 0's cell is work (or memory) that the other GPUs do not
    have, which the picture colours differently.
    """
    share = -(-batch // gpus)  # torch.chunk: equal pieces of ceil(batch / gpus), the last smaller
    last = batch - share * (gpus - 1)
    shares = [share] * (gpus - 1) + [last]
    rest = [""] * (gpus - 1)
    phases = [
        ("1. scatter\nthe batch", [f"{batch} samples\nkeeps {shares[0]}"]
         + [f"{s} samples" for s in shares[1:]], "out"),
        ("2. replicate\nthe model", ["model\n(the original)"] + ["model copy"] * (gpus - 1),
         "out"),
        ("3. parallel_apply:\nforward, 1 thread each", [f"thread {g}\nforward {s}"
                                                       for g, s in enumerate(shares)], ""),
        ("4. gather\nthe outputs", [f"all {batch}\noutputs"]
         + [f"{s} outputs" for s in shares[1:]], "in"),
        ("5. loss", ["loss of all\n" f"{batch} samples"] + rest, ""),
        ("6. backward: copies'\ngradients summed", ["sum of\ngradients"]
         + ["gradients"] * (gpus - 1), "in"),
        ("7. optimizer\nstep", ["update the\nweights"] + rest, ""),
    ]
    home_only = (True, False, False, True, True, True, True)
    return [(*phase, only) for phase, only in zip(phases, home_only, strict=True)]


def draw_data_parallel_step(gpus: int = 4, batch: int = 256):
    """One DataParallel training step on `gpus` GPUs of one machine. Returns the Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if not isinstance(gpus, int) or not 2 <= gpus <= 8:
        raise ValueError(f"gpus must be a whole number from 2 to 8, got {gpus!r}")
    if not isinstance(batch, int) or batch < gpus:
        raise ValueError(f"the batch ({batch!r}) must hold at least one sample per GPU")
    phases = _phases(gpus, batch)
    col_w, row_h, cell_w, cell_h = 1.75, 0.95, 1.45, 0.7
    fig, ax = plt.subplots(figsize=(1.55 * len(phases) + 1.2, 0.85 * gpus + 1.5))
    top = (gpus - 1) * row_h

    for g in range(gpus):
        y = top - g * row_h
        ax.text(-0.15, y, f"GPU {g}" + ("\n(home)" if g == 0 else ""), ha="right",
                va="center", fontsize=9, weight="bold" if g == 0 else "normal")
        ax.plot([0, len(phases) * col_w], [y, y], color="#dddddd", linewidth=0.8, zorder=0)

    for c, (title, cells, arrow, home_only) in enumerate(phases):
        x = c * col_w + col_w / 2
        ax.text(x, top + 0.62, title, ha="center", va="bottom", fontsize=8.5)
        for g, text in enumerate(cells + [""] * (gpus - len(cells))):
            y = top - g * row_h
            colour = IDLE if not text else HOME if g == 0 and home_only else OTHERS
            ax.add_patch(FancyBboxPatch((x - cell_w / 2, y - cell_h / 2), cell_w, cell_h,
                                        boxstyle="round,pad=0.02,rounding_size=0.08",
                                        facecolor=colour, alpha=0.9 if text else 1.0,
                                        edgecolor="#555555" if text else "#cccccc",
                                        linewidth=0.8))
            ax.text(x, y, text or "idle", ha="center", va="center", fontsize=7.5,
                    color="black" if text else "#999999")
        if arrow:
            for g in range(1, gpus):  # GPU 0 -> every GPU ('out'), or back to GPU 0 ('in')
                y0, y1 = top - cell_h / 2, top - g * row_h + cell_h / 2
                start, end = (y0, y1) if arrow == "out" else (y1, y0)
                dx = -cell_w / 2 + 0.12 + 0.12 * (g - 1) if arrow == "out" else (
                    cell_w / 2 - 0.12 - 0.12 * (g - 1))
                ax.add_patch(FancyArrowPatch((x + dx, start), (x + dx, end),
                                             arrowstyle="-|>", mutation_scale=8,
                                             color="#333333", linewidth=0.9, zorder=3))

    ax.text(len(phases) * col_w / 2, -row_h * 0.95,
            f"one process, {gpus} threads. Orange: work and memory that only GPU 0 has. "
            "Steps 1 and 2 copy the batch and the whole model out again at every step.",
            ha="center", va="center", fontsize=8.5, style="italic")
    ax.set_xlim(-1.0, len(phases) * col_w + 0.05)
    ax.set_ylim(-row_h * 1.3, top + 1.25)
    ax.axis("off")
    ax.set_title(f"One nn.DataParallel training step on {gpus} GPUs of one machine "
                 f"(batch of {batch})", fontsize=10.5)
    fig.tight_layout()
    return fig


def lesson_figures() -> dict:
    """Lesson 2's figure: one DataParallel step on 4 GPUs."""
    return {"data_parallel_step.png": draw_data_parallel_step(gpus=4, batch=256)}
