"""The lesson figures, generated (never drawn by hand): drawing only.

A lesson names its figure function in lessons/lessonN/lesson.toml (`figures =
"module:function"`); the function returns {file name: matplotlib Figure}. `make figures`
(ddpcourse.course.lessons, which reads the registry) writes them to lessons/lessonN/figures/;
the notebooks call the same functions.
"""

from __future__ import annotations

from pathlib import Path

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



def pyplot(path: str | None = None):
    """matplotlib.pyplot, drawing off screen (Agg) when the figure goes to a file."""
    import matplotlib

    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish(fig, path: str | None = None):
    """Lay `fig` out tightly, then save_or_return it."""
    fig.tight_layout()
    return save_or_return(fig, path)
