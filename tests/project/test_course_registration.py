"""Every lesson is registered whole: a lesson half added (CONTRIBUTING.md's checklist) fails here.

A lesson lives in lessons/lessonN/ and registers itself in its lesson.toml
(ddpcourse/course/lessons.py reads it); the README's syllabus names it. These tests read files
only: they take seconds.
"""

import ast
import re
import subprocess

import pytest
from util import ROOT

from ddpcourse.course.lessons import all_lessons, all_targets, load_lesson

FOLDERS = sorted(p for p in (ROOT / "lessons").glob("lesson*") if p.is_dir())
LESSONS = all_lessons()
SOLUTIONS = (ROOT / "solutions").is_dir()  # a student release has none


def test_every_lesson_folder_registers_itself():
    assert FOLDERS
    for folder in FOLDERS:
        assert (folder / "lesson.toml").exists(), f"{folder.name} has no lesson.toml"
    assert [lesson.folder for lesson in LESSONS] == sorted(FOLDERS, key=lambda p: int(p.name[6:]))


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.folder.name)
def test_lesson_has_reading_notebook_target_and_syllabus_row(lesson):
    n = lesson.number
    assert lesson.title, "lesson.toml has no title"
    assert (lesson.folder / "README.md").exists(), "no reading (README.md)"
    assert (ROOT / "notebooks" / f"lesson{n}.ipynb").exists(), "no notebook"
    assert f"lesson{n}" in lesson.targets, f"no make target lesson{n}"
    for target in lesson.targets.values():
        assert target.help, f"target {target.name} has no help line"
        assert target.steps, f"target {target.name} runs nothing"
        for step in target.steps:
            file = (step.command[1].replace(".", "/") + ".py" if step.command[0] == "-m"
                    else step.command[0])
            assert (ROOT / file).exists(), f"{target.name}: no {file}"
    rows = [line for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith(f"| {n} |")]
    assert len(rows) == 1, f"README.md's syllabus needs one row for lesson {n}"
    assert f"(lessons/lesson{n}/README.md)" in rows[0] and f"make lesson{n}" in rows[0], rows[0]
    if lesson.figures:
        module, _, name = lesson.figures.partition(":")
        assert (ROOT / (module.replace(".", "/") + ".py")).exists(), lesson.figures
        assert re.search(rf"^def {name}\(", (ROOT / (module.replace(".", "/") + ".py"))
                         .read_text(), re.M), lesson.figures


def functions(path):
    """name -> signature text of every public top-level function in a Python file."""
    tree = ast.parse(path.read_text())
    return {f.name: ast.unparse(f.args) + " -> " + (ast.unparse(f.returns) if f.returns else "")
            for f in tree.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}


@pytest.mark.parametrize("lesson", [lesson for lesson in LESSONS if lesson.exercises],
                         ids=lambda lesson: lesson.folder.name)
def test_exercises_have_stubs_solutions_and_grading_tests_for_every_marker(lesson):
    n = lesson.number
    stub_file = lesson.folder / "exercises.py"
    grading = ROOT / "tests" / "grading" / f"test_lesson{n}.py"
    assert stub_file.exists() and grading.exists()
    assert (lesson.folder / "grading.md").exists(), "no grading.md (what the grader checks)"
    stubs = functions(stub_file)
    stub_text, grading_text = stub_file.read_text(), grading.read_text()
    for marker in lesson.exercises:
        assert re.search(rf'"""Exercise {marker}\b', stub_text), f"no stub names {marker}"
        assert f"@pytest.mark.{marker}\n" in grading_text, f"{grading.name} never grades {marker}"
    used = set(re.findall(r"@pytest\.mark\.(l\d+_\w+)", grading_text))
    assert used <= set(lesson.exercises), f"unregistered markers {used - set(lesson.exercises)}"
    if SOLUTIONS:
        solved = functions(ROOT / "solutions" / f"lesson{n}" / "exercises.py")
        for name, signature in stubs.items():
            assert solved.get(name) == signature, (
                f"{name}: the stub is ({signature}), the solution ({solved.get(name)})")


def test_make_targets_are_unique_and_listed_by_make_help():
    targets = all_targets()  # raises on a name registered twice
    listed = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, text=True,
                            capture_output=True, timeout=30).stdout
    for name in targets:
        assert re.search(rf"^{re.escape(name)}\s", listed, re.M), f"make help lacks {name}"


def test_a_half_registered_lesson_is_reported(tmp_path):
    folder = tmp_path / "lesson9"
    folder.mkdir()
    (folder / "lesson.toml").write_text('title = "x"\n[exercises]\nl3_wrong_lesson = "x"\n')
    with pytest.raises(Exception, match="must be l9_<name>"):
        load_lesson(folder)
    (folder / "lesson.toml").write_text('title = "x"\n[targets.lesson9]\nsteps = ["bash x.sh"]\n')
    with pytest.raises(Exception, match="a step is 'torchrun SCRIPT"):
        load_lesson(folder)


def test_every_target_s_setup_is_a_make_target():
    """A lesson's `setup` (lesson 9's libraries) names a rule of the Makefile, which its
    targets run first; `setup-of` is how the Makefile asks."""
    makefile = (ROOT / "Makefile").read_text()
    for target in all_targets().values():
        assert re.search(rf"^{re.escape(target.setup)}:", makefile, re.M), \
            f"{target.name}: no make target {target.setup}"
    assert {t.setup for t in all_targets().values()} >= {"setup"}
    assert all_targets()["lesson9"].setup == "setup-lesson9"
