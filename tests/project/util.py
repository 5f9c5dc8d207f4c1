"""Shared bits of the project's own tests."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from ddpcourse.course.readings import headings, slug  # noqa: F401 (slug: for the tests)
from ddpcourse.report import parse_summary

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable  # a fork server's stand-in (tests/project/conftest.py)
REAL_PYTHON = os.environ.get("COURSE_REAL_PYTHON", sys.executable)


def grading_tests(lesson: int):
    """tests/grading/test_lessonN.py as a module, for tests that read its cases (its name
    would clash with tests/project/test_lessonN.py under pytest's own import)."""
    import importlib.util

    path = ROOT / "tests" / "grading" / f"test_lesson{lesson}.py"
    spec = importlib.util.spec_from_file_location(f"grading_test_lesson{lesson}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def machine_load() -> str:
    """'load average 7.9 on 2 cores', and whether that is more than the cores: for the message
    of a test that waited for something in bounded time, so that a failure on a loaded
    machine says so instead of passing for a wrong result."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    verdict = "the machine was loaded; rerun when it is quieter" if load > cores else "not loaded"
    return f"load average {load:.1f} on {cores} cores: {verdict}"


def summary(stdout: str) -> dict[str, str]:
    """The fields of a job's one `summary:` line (rank 0 alone prints it), as printed."""
    return parse_summary(stdout, once=True)


def run(cmd, timeout=120, env=None, cwd=ROOT, **kwargs):
    """Run a command with a wall-clock limit and return its CompletedProcess (text)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def share_of_lines_kept(old_script: str, new_script: str) -> float:
    """How much of a script a later one keeps (its non-blank lines found whole, indentation
    aside): near 1 when `diff old new` shows only the later lesson's change."""
    old = [line.strip() for line in (ROOT / "scripts" / old_script).read_text().splitlines()
           if line.strip()]
    new = {line.strip() for line in (ROOT / "scripts" / new_script).read_text().splitlines()}
    return sum(line in new for line in old) / len(old)


# `diff scripts/A.py scripts/B.py` in a script, a reading or a notebook: a promise that B is A
# plus one lesson's change.
PROMISE = re.compile(r"\bdiff (?:-u )?(scripts/[\w/]+\.py) (scripts/[\w/]+\.py)")


def promised_diffs():
    """{(old, new): [where each promise is made]} from scripts, readings and notebooks."""
    found = {}
    sources = [*sorted((ROOT / "scripts").rglob("*.py")), *sorted((ROOT / "lessons").rglob("*.md")),
               *sorted((ROOT / "notebooks").glob("*.ipynb"))]
    for path in sources:
        text = path.read_text()
        if path.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        for old, new in PROMISE.findall(text):
            found.setdefault((old, new), []).append(str(path.relative_to(ROOT)))
    return found


def by_lesson(lessons, apart=()):
    """pytest parameters, one per lesson: lessons 9's and 10's run in `make test-lesson9` and
    `make test-lesson10`, and the lessons in `apart` in `make test-grading` (with them `make
    test` would pass its five minutes)."""
    own = {9: pytest.mark.lesson9, 10: pytest.mark.lesson10}
    own.update({n: pytest.mark.grading_heavy for n in apart})
    return [pytest.param(n, marks=own[n]) if n in own else n for n in lessons]


def train_one_epoch(script, nproc, checkpoint, *args, timeout=150):
    """Lesson 10's steps: one epoch of scripts/`script` on `nproc` processes, its weights
    saved to `checkpoint`: (summary, the checkpoint read back, stdout)."""
    import torch

    from ddpcourse.cluster.launch import launch

    result = launch(f"scripts/{script}", ["--epochs", "1", "--checkpoint", str(checkpoint),
                                          *args],
                    nproc=nproc, timeout=timeout, cwd=str(ROOT), capture=True, echo=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return summary(result.stdout), torch.load(checkpoint, weights_only=False), result.stdout


def runs_once(folder):
    """once(script, nproc, *args): train_one_epoch's result, each run launched once (for a
    module-scoped fixture)."""
    runs = {}

    def once(script, nproc, *args):
        if (script, nproc, args) not in runs:
            runs[script, nproc, args] = train_one_epoch(script, nproc,
                                                        folder / f"{len(runs)}.pt", *args)
        return runs[script, nproc, args]
    return once


def group_fails(folder: Path, times: int, every_launch: bool, lesson: int = 1):
    """A right submission of `lesson` in `folder` whose grading job cannot form its first
    check's group `times` times on every rank of its first launch (or of every launch), as
    gloo once failed to
    connect in a fresh job in CI: the ranks try again together (ddpcourse/course/workers/
    common.py), and a job that still fails says so and is launched once more from that check
    (ddpcourse/course/job_checks.py), at no cost to the student.
    Returns a function listing the marks it left in this machine's /tmp (none where it ran
    in a sandbox of its own), for the test to remove."""
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / f"lesson{lesson}" / "exercises.py",
                folder / "solutions_copy.py")
    marks = f"group-fails-{uuid.uuid4().hex}"  # in the sandbox's /tmp, or the real one
    (folder / "exercises.py").write_text(f"""
import os, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch.distributed as dist
from solutions_copy import *  # noqa: every answer right

_init = dist.init_process_group

def _fails(*args, **kwargs):
    if "RANK" in os.environ:  # in a grading job
        mark = os.path.join(tempfile.gettempdir(), "{marks}")
        mine = mark + ".rank" + os.environ["RANK"]
        with open(mine + ".new", "w") as f:
            f.write(os.environ["MASTER_PORT"])
        try:
            os.link(mine + ".new", mark)  # whole, or not at all: the first launch's port
        except FileExistsError:
            pass
        os.unlink(mine + ".new")
        with open(mark) as f:
            first_launch = f.read() == os.environ["MASTER_PORT"]
        tries = mine + ".tries" + (os.environ["MASTER_PORT"] if {every_launch} else "")
        done = os.path.getsize(tries) if os.path.exists(tries) else 0
        if (first_launch or {every_launch}) and done < {times}:
            with open(tries, "a") as f:
                f.write("x")
            if os.environ["RANK"] == "0":  # inside torch, as gloo fails, after torch counted
                return _init(*args, **dict(kwargs, store=_Broken()))  # the group it names
            raise dist.DistNetworkError("Connection closed by peer")
    return _init(*args, **kwargs)


class _Broken(dist.Store):
    def _fail(self, *args, **kwargs):
        raise dist.DistNetworkError("Connection closed by peer")

    set = get = add = wait = check = compare_set = delete_key = num_keys = _fail
    multi_get = multi_set = _fail

dist.init_process_group = _fails
""")
    return lambda: list(Path(tempfile.gettempdir()).glob(f"{marks}*"))


def grade_class_of(lesson: int, klass: Path, out: Path, timeout: float, env=None) -> dict:
    """`grading class` of every folder under klass, one lesson, two students at a time, as an
    instructor runs it: {student: its row of class.json}."""
    import json

    graded = run([PYTHON, "-m", "ddpcourse.course.grading", "class", str(klass), "--lesson",
                  str(lesson),
                  "--csv", str(out / "class.csv"), "--out", str(out / "class"),
                  "--workers", "2"], timeout=timeout, env=env)
    assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
    return json.loads((out / "class.json").read_text())["students"]


def anchors(page: Path) -> set[str]:
    """The heading anchors of a Markdown page (fenced code left out; repeats get -1, -2)."""
    return set(headings(page))
