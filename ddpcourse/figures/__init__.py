"""The lesson figures, generated (never drawn by hand): `make figures` writes them all.

A lesson names its figure function in lessons/lessonN/lesson.toml (`figures =
"module:function"`); the function returns {file name: matplotlib Figure} and the files go to
lessons/lessonN/figures/. The notebooks call the same functions.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path

from ddpcourse.course.lessons import all_lessons


def figure_functions() -> dict[int, Callable[[], dict]]:
    """lesson number -> its registered figure function."""
    found = {}
    for lesson in all_lessons():
        if lesson.figures:
            module, _, name = lesson.figures.partition(":")
            found[lesson.number] = getattr(importlib.import_module(module), name)
    return found


DPI = 110


def save_or_return(fig, path: str | None = None):
    """Save `fig` to `path` (making its folder) and return the path; without a path, return
    the Figure, for a notebook to show."""
    if not path:
        return fig
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return path


def write_figures(lessons: list[int] | None = None, out_root: Path | None = None) -> list[Path]:
    """Render the figures of `lessons` (all by default); returns the files written."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    functions = figure_functions()
    written = []
    for lesson in lessons or sorted(functions):
        folder = (out_root or Path(__file__).resolve().parents[2] / "lessons") \
            / f"lesson{lesson}" / "figures"
        for name, fig in functions[lesson]().items():
            path = folder / name
            save_or_return(fig, path)
            written.append(path)
    return written
