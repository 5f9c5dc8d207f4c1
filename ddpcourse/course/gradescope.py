"""Gradescope's autograder for the course: `make gradescope [LESSON=n]` builds its zip.

Gradescope's contract (gradescope-autograders.readthedocs.io, "Autograder Specifications"):
the zip holds `setup.sh` and `run_autograder` at its root and is unpacked into
/autograder/source; setup.sh runs once, as root on an Ubuntu image, when Gradescope builds the
autograder; run_autograder runs for every submission, from /autograder, with the student's
files in /autograder/submission, and must write /autograder/results/results.json:
{"score", "output", "tests": [{"name", "score", "max_score", "status", "output"}]}.

Here the zip is the student release (`make student-release`: the course with its grader,
without solutions/) plus those two scripts: setup.sh makes the course's .venv (`make setup`),
run_autograder runs `grade` below, which grades the submission with the course's own grader
(`run_grading`, as `make grade` does) and writes each grading test with its points and, when
it did not pass, what it said. The standard library only, up to the grading itself:
`build` runs with the system Python, before any .venv exists.

    python -m ddpcourse.course.gradescope build RELEASE_DIR --zip PATH [--lesson N]
    python -m ddpcourse.course.gradescope grade [--lesson N] [--root /autograder]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import secrets
import stat
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from ddpcourse.course import intake
from ddpcourse.course.feedback import graded_tests
from ddpcourse.course.grading import lesson_number, run_grading, score_table, summarise
from ddpcourse.course.lessons import all_lessons
from ddpcourse.course.term import lesson_of
from ddpcourse.exercises import ROOT

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder: it makes the course's
# .venv in /autograder/source, as a student's `make setup` does.
set -euo pipefail
cd "$(dirname "$0")"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The course needs Python 3.11 or newer (tomllib); Ubuntu 22.04's python3 is 3.10.
if python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  apt-get install -y -qq make python3-venv
  python=python3
else
  apt-get install -y -qq make python3.11 python3.11-venv
  python=python3.11
fi
# Gradescope has no GPU: torch's CPU wheels, a fraction of the size of the CUDA ones.
PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make setup PYTHON="$python"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: it grades {what} with the course's grader and
# writes results/results.json (ddpcourse/course/gradescope.py).
# AUTOGRADER_ROOT: a folder laid out as /autograder to use instead (the course's tests use one);
# COURSE_PYTHON: an interpreter with the course's requirements instead of setup.sh's .venv.
set -euo pipefail
# The seed of the hidden cases (ddpcourse/course/hidden.py): one per zip, so every submission
# of the assignment is graded on the same ones; the zip is the instructor's, never a student's.
export COURSE_HIDDEN_SEED='{seed}'
root=${{AUTOGRADER_ROOT:-/autograder}}
cd "$root/source"
exec "${{COURSE_PYTHON:-$root/source/.venv/bin/python}}" -m ddpcourse.course.gradescope \\
  grade --root "$root" --lesson '{lesson}'
"""

EXECUTABLE = 0o755


HELD_BACK = """Not passed. This test also checks cases drawn at grading time, which the course \
does not show: what it said comes after the due date, in the entry below it. The cases written \
in the test are yours to run: `make grade LESSON={lesson}` in your copy of the course, or \
`.venv/bin/pytest tests/grading -m {exercise}`."""


class SubmissionError(Exception):
    """The submission holds nothing the grader can read; the message says what to upload."""


# --- the zip ---------------------------------------------------------------------------------

def build(release: Path, zip_path: Path, lesson: int | None, seed: str) -> Path:
    """Gradescope's zip: the files of the student release at `release`, and the two scripts,
    run_autograder holding the hidden cases' seed."""
    if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", seed):
        raise SystemExit(f"error: COURSE_HIDDEN_SEED={seed!r}: use letters, digits, - and _ "
                         "(at most 64)")
    release = Path(release)
    if not (release / "tests" / "grading").is_dir() or (release / "solutions").exists():
        raise SystemExit(f"error: {release} is not a student release (make student-release)")
    if lesson is not None and not (release / "tests" / "grading" /
                                   f"test_lesson{lesson}.py").exists():
        raise SystemExit(f"error: lesson {lesson} has no graded exercises")
    scripts = {"setup.sh": SETUP,
               "run_autograder": RUN_AUTOGRADER.format(
                   lesson="" if lesson is None else lesson, seed=seed,
                   what=f"lesson {lesson}" if lesson else "every lesson")}
    zip_path = Path(zip_path)
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    partial = zip_path.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(release.rglob("*")):
            if path.is_file() and path.relative_to(release).as_posix() not in scripts:
                archive.write(path, path.relative_to(release).as_posix())
        for name, text in scripts.items():
            entry = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
            entry.external_attr = (stat.S_IFREG | EXECUTABLE) << 16  # Gradescope runs them
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, text)
    partial.replace(zip_path)
    return zip_path


# --- grading one submission ----------------------------------------------------------------

def staged_submission(submission: Path, lesson: int | None, stage: Path) -> tuple[Path, Path]:
    """(the folder to grade, laid out as DIR/lessonN/exercises.py; the folder the student's
    file names start from) for the student's upload, its files taken as every submission's
    are (ddpcourse/course/intake.py: no link followed, plain files of bounded size).

    Students upload their exercises.py alone (graded as the zip's lesson), lessonN/ folders,
    or their copy of the course (lessons/lessonN/, as Gradescope's GitHub upload does); a zip
    of a folder instead of its contents puts all of it one folder deeper. A lone lessonN/
    folder of another lesson is not taken for this lesson's.
    """
    lessons = [lesson] if lesson is not None else [
        registered.number for registered in all_lessons() if registered.exercises]
    taken = {}
    for n in lessons:
        try:
            taken[n] = intake.take_placed(submission, n, loose=lesson is not None)
        except intake.Missing:
            continue
        except intake.Refused as why:
            raise SubmissionError(f"Not graded, 0 points: {why}.") from None
    if not taken:
        entries = [p for p in submission.iterdir() if not p.name.startswith(".")] \
            if submission.is_dir() and not submission.is_symlink() else []
        if (len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink()
                and not re.fullmatch(r"lessons?\d*", entries[0].name)):
            return staged_submission(entries[0], lesson, stage)
        if lesson is None and os.path.lexists(submission / "exercises.py"):
            raise SubmissionError("This autograder grades every lesson: upload each lesson's "
                                  "file in a folder of its own, lesson1/exercises.py, ...")
        uploaded = sorted(str(p.relative_to(submission)) for p in submission.rglob("*")
                          if p.is_file()) if entries else []
        want = f"lesson {lesson}'s exercises.py" if lesson else "lessonN/exercises.py folders"
        raise SubmissionError(f"No exercises.py to grade: upload {want}. "
                              f"Uploaded: {', '.join(uploaded[:20]) or 'nothing'}.")
    stage.mkdir(parents=True, exist_ok=True)
    os.chmod(stage, 0o755)  # the grader reads it again, as an unprivileged user
    named_from = stage
    for n, (files, place) in taken.items():
        folder = stage / (place or f"lesson{n}/")
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        if not place:  # a lone exercises.py: named as uploaded
            named_from = folder
    return stage, named_from


def gradescope_results(out_dir: Path, uploaded: Path, lesson: int | None) -> dict:
    """Gradescope's results.json from the grading run in out_dir: one entry per grading test.
    The student's files are named from `uploaded`, as they uploaded them."""
    tests = graded_tests(out_dir)
    if not tests:
        return {"score": 0, "output": "The grader could not run; the instructor can see why in "
                                      "the autograder's output."}

    def shown(text: str) -> str:
        return text.replace(f"{uploaded.resolve()}/", "")

    entries = []
    for t in tests:
        entry = {"name": f"{t.exercise}: {t.name}", "score": t.earned, "max_score": t.points,
                 "status": "passed" if t.outcome == "passed" else "failed",
                 "output": shown(t.message) if t.message else "Passed."}
        entries.append(entry)
        if t.message and t.hidden_cases:
            # The message may name a case drawn at grading time: shown after the due date.
            entry["output"] = HELD_BACK.format(lesson=lesson_of(t.exercise), exercise=t.exercise)
            entries.append({"name": f"{t.exercise}: {t.name}, what it said", "score": 0,
                            "max_score": 0, "status": "failed", "visibility": "after_due_date",
                            "output": shown(t.message)})
    scores = summarise({t.nodeid: {"exercise": t.exercise, "points": t.points,
                                   "outcome": t.outcome} for t in tests})
    graded = f"lesson {lesson}" if lesson else "every lesson"
    rerun = (f"make grade LESSON={lesson}" if lesson else "make grade")
    output = (f"Graded {graded} with the course's grader; the same checks run in your copy of "
              f"the course with `{rerun}`, one exercise with `.venv/bin/pytest tests/grading "
              f"-m <exercise>`.\n\n{score_table(scores)}")
    return {"score": sum(t.earned for t in tests), "output": output, "tests": entries}


def lateness(metadata: Path) -> str:
    """'Submitted ... after the due date' from Gradescope's submission_metadata.json
    (created_at, assignment.due_date), or '' when on time or unknown. Gradescope applies the
    assignment's own late policy to the score; this says so to the student."""
    try:
        data = json.loads(metadata.read_text())
        created = dt.datetime.fromisoformat(data["created_at"])
        due = dt.datetime.fromisoformat(data["assignment"]["due_date"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    if created <= due:
        return ""
    hours = (created - due).total_seconds() / 3600
    after = f"{hours / 24:.1f} days" if hours >= 24 else f"{hours:.1f} hours"
    return (f"Submitted {after} after the due date ({due.isoformat()}): the assignment's late "
            "policy applies to this score.")


def grade(root: Path, lesson: int | None) -> dict:
    """Grade root/submission, write root/results/results.json in Gradescope's format."""
    started = time.monotonic()
    submission = root / "submission"
    # Outside the course, so that pytest names the student's file by its absolute path, which
    # `shown` takes off.
    with tempfile.TemporaryDirectory(prefix="submission-") as stage:
        try:
            graded, uploaded = staged_submission(submission, lesson, Path(stage))
        except SubmissionError as error:
            results = {"score": 0, "output": str(error)}
        else:
            out_dir = ROOT / "build" / "grades" / "gradescope"
            run_grading(lesson, out_dir, submission=str(graded))
            results = gradescope_results(out_dir, uploaded, lesson)
    late = lateness(root / "submission_metadata.json")
    if late:
        results["output"] = f"{late}\n\n{results['output']}"
    results["execution_time"] = round(time.monotonic() - started)
    (root / "results").mkdir(parents=True, exist_ok=True)
    (root / "results" / "results.json").write_text(json.dumps(results, indent=1))
    print(f"gradescope: {results['score']:g} points written to "
          f"{root / 'results' / 'results.json'}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Gradescope's autograder for the course.")
    sub = parser.add_subparsers(dest="command", required=True)
    zip_it = sub.add_parser("build", help="the autograder zip, from a student release")
    zip_it.add_argument("release", type=Path, help="a folder made by make student-release")
    zip_it.add_argument("--zip", type=Path, required=True)
    run = sub.add_parser("grade", help="grade ROOT/submission into ROOT/results/results.json")
    run.add_argument("--root", type=Path,
                     default=Path(os.environ.get("AUTOGRADER_ROOT", "/autograder")))
    for p in (zip_it, run):
        p.add_argument("--lesson", type=lesson_number, default=None)
    args = parser.parse_args(argv)
    if args.command == "build":
        seed = os.environ.get("COURSE_HIDDEN_SEED", "").strip() or secrets.token_hex(8)
        path = build(args.release, args.zip, args.lesson, seed)
        print(f"Gradescope autograder written to {path}: upload it as the assignment's "
              f"autograder (zip), and in its Autograder Settings give it at least 3 GB of "
              f"memory and 2 CPUs (tests/grading/README.md lists each lesson's peak). "
              f"Hidden cases: seed {seed}, in the zip (give it as COURSE_HIDDEN_SEED "
              "to build the same again)")
    else:
        grade(args.root.resolve(), args.lesson)
    return 0


if __name__ == "__main__":
    sys.exit(main())
