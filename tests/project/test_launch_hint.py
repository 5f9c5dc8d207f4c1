"""A script started without torchrun says how to start it on several processes: its own make
target and its own torchrun command (ddpcourse.runtime.launch_hint, from the `make ...` line its
docstring shows), never those of the script it was copied from."""

import ast
import re

import pytest
from util import PYTHON, ROOT, run

from ddpcourse.course.lessons import all_targets
from ddpcourse.runtime import launch_hint

# Every script whose hint comes from itself; lesson5_slurm_whoami.py, which srun starts, says
# `sbatch ...` instead.
SELF_HINTED = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "scripts").rglob("*.py"))
               if "world_of_one_unless_launched()" in p.read_text()]


def hint_of(script: str) -> str:
    return launch_hint(script, ast.get_docstring(ast.parse((ROOT / script).read_text())))


def starts(target, script: str) -> bool:
    """Does the make target start `script`: as one of its steps, or through a step (a drill)
    whose source names it?"""
    steps = [ROOT / step.command[0] for step in target.steps]
    return any(step == ROOT / script or step.is_file() and script in step.read_text()
               for step in steps)


def test_every_step_script_says_how_to_launch_itself():
    steps = {str(p.relative_to(ROOT)) for p in (ROOT / "scripts").glob("*.py")
             if "world_of_one_unless_launched" in p.read_text()}
    assert steps and steps <= set(SELF_HINTED), sorted(steps - set(SELF_HINTED))


@pytest.mark.parametrize("script", SELF_HINTED)
def test_a_launch_hint_names_its_script_and_the_target_that_runs_it(script):
    hint = hint_of(script)
    lesson = re.search(r"lesson(\d+)_", script).group(1)
    if not (ROOT / "lessons" / f"lesson{lesson}" / "lesson.toml").exists():
        # A lesson not registered yet (one being built) has no make target to name.
        assert hint == f"torchrun --nproc-per-node=2 {script}", hint
        return
    assert hint.endswith(f" {script})"), hint
    make = re.match(r"make ([\w-]+)", hint)
    assert make, f"{script}: its docstring shows no `make TARGET` line to hint at: {hint}"
    targets = all_targets()
    assert make.group(1) in targets, f"{script} hints at `make {make.group(1)}`, no such target"
    assert starts(targets[make.group(1)], script), (
        f"{script} hints at `make {make.group(1)}`, which does not run it (lesson.toml)")


def test_a_launch_hint_counts_every_process_on_one_node():
    doc = "Title.\n\n    make lesson4 NNODES=2 NPROC=3     # two simulated nodes\n"
    assert launch_hint("scripts/x.py", doc) == (
        "make lesson4 NNODES=2 NPROC=3  (or: torchrun --nproc-per-node=6 scripts/x.py)")
    assert launch_hint("scripts/x.py", "Title, no make line.") == (
        "torchrun --nproc-per-node=2 scripts/x.py")  # the Makefile's NPROC
    assert launch_hint("scripts/x.py", None) == "torchrun --nproc-per-node=2 scripts/x.py"


# Two of the steps that once named lesson 3's script and target; --epochs 0: start-up only.
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("script", ["scripts/lesson6_preemptible.py",
                                    "scripts/lesson7_mixed_precision.py"])
def test_a_step_started_without_torchrun_hints_at_itself(script, tmp_path):
    result = run([PYTHON, script, "--epochs", "0", "--checkpoint", str(tmp_path / "model.pt"),
                  *(["--snapshot", str(tmp_path / "snap.pt")] if "preempt" in script else [])],
                 timeout=100, env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stdout + result.stderr
    assert (f"note: not started by torchrun, so this runs as a world of one process. To start "
            f"several: {hint_of(script)}\n") in result.stderr, result.stderr


def test_a_script_whose_library_is_not_installed_says_which_make_target_adds_it(tmp_path):
    # Lesson 9's scripts need libraries `make setup-lesson9` adds: without one, a line, not
    # an ImportError's traceback. A script that needs a library no machine has stands in.
    script = tmp_path / "needs_it.py"
    script.write_text("from ddpcourse.runtime import needs_library\n"
                      "needs_library('no_such_library_here', 'make setup-lesson9')\n"
                      "import no_such_library_here\n")
    result = run([PYTHON, str(script)], timeout=60)
    assert result.returncode == 1
    assert result.stderr == ("error: no_such_library_here is not installed here: "
                             "`make setup-lesson9` adds it to .venv\n")
    assert "lesson9" in (ROOT / "scripts" / "lesson9_fabric.py").read_text().split(
        "needs_library(", 1)[1].split(")", 1)[0]
