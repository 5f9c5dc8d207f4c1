"""Lesson 9's notebook trains DDP inside its own kernel, and shows what refuses to start there.

notebooks/lesson9.ipynb is executed with nbclient, as tests/project/test_notebooks_and_docs.py
executes every notebook, and its outputs are read: a spawned worker of a function defined in
the notebook dies unpickling it, a forked one runs it; Lightning's Trainer (`ddp_notebook`, fork)
and Accelerate's notebook_launcher each train on two workers forked from the kernel, in a world
of 2, to the weights of DDP written by hand in the notebook, bit for bit, and of one process
within float rounding; the Trainer and Fabric refuse `ddp` and `ddp_spawn` in one line; the
launchers' table is printed. One test executes the notebook, so that pytest-xdist never runs it
twice.

`make test-lesson9` runs this; without lesson 9's packages it skips, saying why.
"""

import json
import re
import time
from pathlib import Path

import pytest

from ddpcourse.report import parse_summary, parse_table

for library in ("lightning", "accelerate", "deepspeed", "distributed"):
    pytest.importorskip(library, reason="lesson 9's packages are not installed "
                                        "(make test-lesson9 installs them)")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "lesson9.ipynb"


def test_the_notebook_is_stored_without_outputs():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    assert [c for c in cells if c["cell_type"] == "code"]
    for cell in cells:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None


def output_of(nb, source: str, name: str = "stdout") -> str:
    """What the one code cell whose source holds `source` printed on `name`."""
    cells = [c for c in nb.cells if c.cell_type == "code" and source in c.source]
    assert len(cells) == 1, f"{len(cells)} code cells hold {source!r}"
    return "".join(o.text for o in cells[0].outputs
                   if o.output_type == "stream" and o.name == name)


@pytest.mark.timeout(600)
def test_the_notebook_trains_ddp_inside_its_kernel_and_shows_what_refuses():
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    started = time.monotonic()
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    print(f"lesson9.ipynb: {time.monotonic() - started:.1f} s")
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
                if o.output_type == "error"]
    kernel = re.search(r"this kernel is process (\d+)", output_of(nb, "KERNEL = ")).group(1)

    # Spawn: the worker cannot find the notebook's function in its __main__; fork runs it.
    spawn = output_of(nb, 'start("spawn"')
    assert re.search(r"^spawn: ProcessExitedException: process \d terminated with exit code 1; "
                     r"the worker said: AttributeError: Can't get attribute 'hello' on "
                     r"<module '__main__'", spawn, re.M), spawn
    assert "reports written by the spawned workers: False" in spawn
    fork = output_of(nb, 'start("fork", hello')
    assert fork.startswith("fork: both workers ended with exit code 0")
    assert [(r["rank"], r["parent"]) for r in parse_table(fork)] == [
        ("0", f"{kernel} (this kernel)"), ("1", f"{kernel} (this kernel)")]
    assert "CUDA initialised in this kernel: False" in output_of(nb, "_lazy_init")

    # The Trainer and notebook_launcher: two workers forked from the kernel, a world of 2.
    for source, how in (
            ("trainer.fit(digits)", "Trainer, ddp_notebook"),
            ("notebook_launcher(train_with_accelerate", "Accelerate, notebook_launcher")):
        printed = output_of(nb, source)
        workers = parse_table(printed)
        assert [(w["rank"], w["how"], w["world size"], w["backend"], w["parent"])
                for w in workers] == [(str(r), how, "2", "gloo", f"{kernel} (this kernel)")
                                      for r in (0, 1)], printed
        assert len({w["pid"] for w in workers} | {kernel}) == 3  # the kernel took no rank
    launched = output_of(nb, "notebook_launcher(train_with_accelerate")
    assert [(w["RANK"], w["LOCAL_RANK"]) for w in parse_table(launched)] == [("0", "0"),
                                                                             ("1", "1")]
    assert "Launching training on 2 " in launched  # "CUDAs", even without a GPU
    assert ("after it: torch.distributed.elastic.multiprocessing.api._terminate_process_handler"
            in launched)
    assert "'start_method': 'fork'" in output_of(nb, "StrategyRegistry[")

    # Hand-written DDP's weights, bit for bit; one process's within float rounding.
    compared = output_of(nb, "against hand-written DDP")
    rows = {r["run"]: r for r in parse_table(compared)}
    for run in ("Trainer, ddp_notebook", "Accelerate, notebook_launcher"):
        row = rows[f"{run} against hand-written DDP"]
        assert (row["tensors not equal"], float(row["max |gap|"])) == ("0 of 4", 0.0), compared
    assert float(rows["hand-written DDP against one process"]["max |gap|"]) < 1e-4, compared
    assert float(rows["(the initial weights against one process)"]["max |gap|"]) > 0.1

    # Refused in one line each, before anything starts.
    refused = output_of(nb, "_basic_subprocess_cmd()")
    for build, strategy, kind in (("Trainer", "ddp", "MisconfigurationException"),
                                  ("Trainer", "ddp_spawn", "MisconfigurationException"),
                                  ("Fabric", "ddp", "RuntimeError")):
        assert (f"{build}, {strategy}: {kind}: `{build}(strategy='{strategy}')` is not "
                "compatible with an interactive environment.") in refused, refused
    assert re.search(r"^strategy='ddp' would run: python\S* ipykernel_launcher\.py -f ", refused,
                     re.M), refused

    # The picture of the job, and the launchers' table.
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.outputs)
    table = output_of(nb, "lesson9_launchers.py")
    assert parse_summary(table) == {"launchers": "6", "workers": "12"}
