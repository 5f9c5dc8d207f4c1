"""The one adapter to exercise code: lesson scripts and the grader load exercises through it.

Which code is loaded comes from two environment variables:

    COURSE_IMPL=student     lessons/lessonN/exercises.py   (the stubs, or your edits)
    COURSE_IMPL=solutions   solutions/lessonN/exercises.py (the reference)
    COURSE_SUBMISSION=DIR   DIR/lessonN/exercises.py, or DIR/lessons/lessonN/exercises.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMPLS = ("student", "solutions")


def exercise_folder() -> Path:
    """The folder COURSE_SUBMISSION / COURSE_IMPL point at, which holds lessonN/ folders (a
    submission may hold them under lessons/ instead)."""
    submission = os.environ.get("COURSE_SUBMISSION", "").strip()
    if submission:
        return Path(submission).expanduser()
    impl = os.environ.get("COURSE_IMPL", "student").strip() or "student"
    if impl not in IMPLS:
        raise ValueError(f"COURSE_IMPL={impl!r}: use one of {', '.join(IMPLS)}")
    return ROOT / ("lessons" if impl == "student" else "solutions")


def exercise_file(lesson: int) -> Path:
    """The exercise file of `lesson` that COURSE_IMPL / COURSE_SUBMISSION point at (inside a
    sandbox: the copy the grader made; the grader itself reads a submission only through
    ddpcourse/course/intake.py)."""
    submission = os.environ.get("COURSE_SUBMISSION", "").strip()
    if submission:
        base = exercise_folder().resolve()
        candidates = [base / f"lesson{lesson}" / "exercises.py",
                      base / "lessons" / f"lesson{lesson}" / "exercises.py"]
        for path in candidates:
            if path.exists():
                return path
        raise FileNotFoundError(f"submission {base} has no lesson{lesson}/exercises.py")
    impl = os.environ.get("COURSE_IMPL", "student").strip() or "student"
    path = exercise_folder() / f"lesson{lesson}" / "exercises.py"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist"
                                + (" (this copy of the course has no solutions)"
                                   if impl == "solutions" else ""))
    return path


def load_exercises(lesson: int):
    """Import the exercise module of `lesson` from wherever the environment says."""
    path = exercise_file(lesson)
    name = f"graded_lesson{lesson}_exercises"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


def exercises_for_a_script(lesson: int, impl: str = "auto"):
    """(module, impl): the exercises a lesson script runs. impl "auto" takes the reference
    solutions where this copy of the course has them, else your own
    lessons/lessonN/exercises.py (a student copy has no solutions/)."""
    if impl == "auto":
        has_solutions = (ROOT / "solutions" / f"lesson{lesson}" / "exercises.py").exists()
        impl = "solutions" if has_solutions else "student"
    os.environ["COURSE_IMPL"] = impl
    return load_exercises(lesson), impl
