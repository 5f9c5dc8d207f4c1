"""Notebooks are committed clean and all run; figures regenerate; the readings' links resolve."""

import json
import re
import time

import pytest
from util import ROOT

from ddpcourse.figures import FIGURES, write_figures

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
READINGS = sorted((ROOT / "lessons").glob("lesson*/README.md")) + [ROOT / "README.md"]


def test_there_is_a_notebook_and_a_reading_per_lesson():
    lessons = sorted(p.name for p in (ROOT / "lessons").glob("lesson*") if p.is_dir())
    assert lessons
    for lesson in lessons:
        assert (ROOT / "notebooks" / f"{lesson}.ipynb").exists(), lesson
        assert (ROOT / "lessons" / lesson / "README.md").exists(), lesson


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_from_top_to_bottom(path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    started = time.monotonic()
    NotebookClient(nb, timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    shown = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.outputs
                if "image/png" in o.get("data", {}))
    assert shown >= 1, "a lesson notebook shows at least one diagram"
    print(f"{path.name}: {time.monotonic() - started:.1f} s")


def test_figures_regenerate(tmp_path):
    written = write_figures(out_root=tmp_path)
    assert len(written) >= sum(len(f()) for f in FIGURES.values()) > 0
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        committed = ROOT / "lessons" / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is not committed: run make figures"


@pytest.mark.parametrize("reading", READINGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_in_readings_resolve(reading):
    text = reading.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        assert (reading.parent / target).exists(), f"{reading.name} links to missing {target}"
