"""The lesson figures, generated (never drawn by hand): `make figures` writes them all.

Each lesson registers functions that return {file name: matplotlib Figure}; the files go
to lessons/lessonN/figures/. The notebooks call the same functions.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lesson1_figures() -> dict:
    from ddpcourse.topology import draw, layout

    return {
        "two_nodes_one_gpu_per_process.png": draw(
            layout(2, 4, 1), gpus_per_node=4,
            title="2 nodes x 4 GPUs, 1 GPU per process: world size 8"),
        "two_nodes_two_gpus_per_process.png": draw(
            layout(2, 4, 2), gpus_per_node=4,
            title="2 nodes x 4 GPUs, 2 GPUs per process: world size 4"),
    }


def lesson2_figures() -> dict:
    from ddpcourse.dataparallel_draw import draw_data_parallel_step

    return {"data_parallel_step.png": draw_data_parallel_step(gpus=4, batch=256)}


def lesson3_figures() -> dict:
    from ddpcourse.ddp_draw import lesson_figures

    return lesson_figures()  # DistributedSampler's split, and one DDP step


def lesson4_figures() -> dict:
    from ddpcourse.collectives_draw import lesson_figures

    return lesson_figures(world_size=4)  # every collective before/after, and the ring


FIGURES = {1: lesson1_figures, 2: lesson2_figures, 3: lesson3_figures, 4: lesson4_figures}


def write_figures(lessons: list[int] | None = None, out_root: Path | None = None) -> list[Path]:
    """Render the figures of `lessons` (all by default); returns the files written."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib.pyplot as plt

    written = []
    for lesson in lessons or sorted(FIGURES):
        folder = (out_root or ROOT / "lessons") / f"lesson{lesson}" / "figures"
        folder.mkdir(parents=True, exist_ok=True)
        for name, fig in FIGURES[lesson]().items():
            path = folder / name
            fig.savefig(path, dpi=110, metadata={"Software": None})
            plt.close(fig)
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description="Write every lesson figure.")
    parser.add_argument("--lesson", type=int, action="append")
    parser.add_argument("--out", type=Path, default=None, help="a folder instead of lessons/")
    args = parser.parse_args()
    for path in write_figures(args.lesson, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
