"""GitHub Classroom's autograding: the workflow the student release carries, and its steps.

GitHub Classroom takes a student's points from the workflow named "Autograding Tests", whose
one job, run-autograding-tests, ends with classroom-resources/autograding-grading-reporter:
the reporter adds up what earlier steps report (each step's `result` output: base64 of JSON
with a max_score and tests that each carry a score) and posts the total to Classroom.

Classroom's ready-made step for a command, autograding-command-grader, awards all of its
max-score when the command exits 0 and nothing otherwise. A step per exercise would then
turn "this mistake costs 4 of 10" into 0 of 10, and a step per grading test would launch a
lesson's torchrun jobs once per test. So the workflow grades each lesson once, as `make grade
LESSON=n` does (its jobs shared by all its tests), and then a step per exercise `report`s
that exercise's tests with the points each earned: the grader's partial credit, reported in
the reporter's format.

The student's push must not decide its points, and every file of its repository is the
student's: a tests/conftest.py, pyproject.toml's pytest options, the Makefile and
requirements.txt would all run if the workflow graded from that checkout. So the workflow
checks the push out into student/ and runs nothing of it: the grader comes from a pinned
commit of another repository (the student release, GRADER=owner/repo@commit) into grader/,
which grades with `--submission ../student` (the grader reads only the lessons' .py files).

The points come from the grader alone (each grading test's `points(n)`): `make
classroom-workflow` writes the workflow from them.

    python -m ddpcourse.course.classroom workflow --grader OWNER/REPO@COMMIT [--lesson N] [--out F]
    python -m ddpcourse.course.classroom check-grader OWNER/REPO@COMMIT
    python -m ddpcourse.course.classroom report GRADES_DIR EXERCISE --max-score P
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ddpcourse.course.feedback import graded_tests
from ddpcourse.course.grading import GRADING_TESTS, lesson_number, summarise
from ddpcourse.course.lessons import all_lessons
from ddpcourse.exercises import ROOT

# GitHub's rules: an owner of up to 39 letters, digits and inner hyphens; a repository name
# of letters, digits, '.', '-', '_'. A full commit id: a branch or tag could be moved.
GRADER = re.compile(r"(?P<repo>[A-Za-z0-9](?:[A-Za-z0-9-]{0,37}[A-Za-z0-9])?"
                    r"/(?!\.\.?@)[A-Za-z0-9._-]{1,100})@(?P<commit>[0-9a-f]{40})")

HEADER = """\
# GitHub Classroom's autograding: on every push, a pinned grader grades the push's
# lessons/*/exercises.py (nothing else of the push runs) and each exercise's points go to
# Classroom. The grader: {repo}@{commit}
# Written by `make classroom-workflow GRADER=owner/repo@commit` (ddpcourse/course/classroom.py)
# from the grading tests' points: change those, not this file.
name: Autograding Tests  # the one workflow Classroom reads points from
"on": [push, repository_dispatch, workflow_dispatch]
permissions:
  checks: write
  actions: read
  contents: read
jobs:
  run-autograding-tests:  # Classroom's name for its one job
    runs-on: ubuntu-latest
    if: github.actor != 'github-classroom[bot]'  # not the commit that creates the repository
    timeout-minutes: 60
    env:
      GRADES: build/grades  # in grader/
    steps:
      - name: Check out the student's push (only its exercise files are read)
        uses: actions/checkout@v4
        with:
          path: student
          persist-credentials: false  # no token left in student/.git for graded code to read
      - name: Check out the grader (a pinned commit the push cannot change)
        uses: actions/checkout@v4
        with:
          repository: {repo}
          ref: {commit}
          path: grader
          # An organisation secret for a private grader repository; else the job's own token.
          token: ${{{{ secrets.GRADER_TOKEN || github.token }}}}
          persist-credentials: false
      - uses: actions/setup-python@v5
        with:
          python-version: "3.12"
      - name: Set up the grader (make -C grader setup)
        env:
          # GitHub's runners have no GPU: torch's CPU wheels, a fraction of the download.
          PIP_EXTRA_INDEX_URL: https://download.pytorch.org/whl/cpu
        run: make -C grader setup
"""

LESSON_STEP = """\
      - name: "Lesson {n}: grade (as make grade LESSON={n})"
        if: ${{{{ !cancelled() }}}}
        working-directory: grader
        run: >-
          .venv/bin/python -m ddpcourse.course.grading grade --lesson {n} --submission ../student
          --out "$GRADES/lesson{n}"
"""

EXERCISE_STEP = """\
      - name: "{exercise}: {points:g} points"
        id: {exercise}
        if: ${{{{ !cancelled() }}}}
        working-directory: grader
        run: >-
          .venv/bin/python -m ddpcourse.course.classroom report "$GRADES/lesson{n}" {exercise}
          --max-score {points:g} >> "$GITHUB_OUTPUT"
"""

REPORTER = """\
      - name: Report the points to GitHub Classroom
        if: ${{{{ !cancelled() }}}}
        uses: classroom-resources/autograding-grading-reporter@v1
        env:
{env}
        with:
          runners: >-
{runners}
"""


def grader_points() -> dict[str, float]:
    """exercise -> its points, as the grading tests' points(n) markers add up (pytest's own
    collection, which runs no test)."""
    with tempfile.TemporaryDirectory() as folder:
        results = Path(folder) / "results.json"
        collected = subprocess.run(
            [sys.executable, "-m", "pytest", str(GRADING_TESTS), "--collect-only", "-q",
             "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=300,
            env=dict(os.environ, COURSE_RESULTS=str(results)))
        if collected.returncode != 0 or not results.exists():
            raise SystemExit("error: cannot collect the grading tests:\n"
                             + (collected.stdout + collected.stderr)[-3000:])
        tests = json.loads(results.read_text())["tests"]
    return {name: s["possible"] for name, s in summarise(tests).items()}


def grader_pin(value: str) -> tuple[str, str]:
    """'owner/repo@<40-hex commit>' -> (owner/repo, commit), or SystemExit with one line."""
    pin = GRADER.fullmatch(value.strip())
    if pin is None:
        raise SystemExit(f"error: GRADER={value!r}: use owner/repo@commit, the commit in full "
                         "(40 lowercase hex digits) of the student release the grader comes from")
    return pin["repo"], pin["commit"]


def graded_lessons(lesson_number: int | None = None) -> list:
    """The lessons with exercises, or the one numbered lesson_number (SystemExit if none)."""
    graded = [lesson for lesson in all_lessons() if lesson.exercises]
    if lesson_number is None:
        return graded
    if not any(lesson.number == lesson_number for lesson in graded):
        numbers = ", ".join(str(lesson.number) for lesson in graded)
        raise SystemExit(f"error: LESSON={lesson_number}: no graded lesson has that number "
                         f"(graded lessons: {numbers})")
    return [lesson for lesson in graded if lesson.number == lesson_number]


def workflow_text(points: dict[str, float], grader: str, lesson_number: int | None = None) -> str:
    """The workflow: check out the push and the pinned grader, set up the grader, then per
    lesson one grading run and a step per exercise; with lesson_number, that lesson alone
    (an assignment per lesson: a push grades only its lesson)."""
    repo, commit = grader_pin(grader)
    steps, runners, lines = [], [], []
    for lesson in graded_lessons(lesson_number):
        steps.append(LESSON_STEP.format(n=lesson.number))
        lines.append("            " + ",".join(lesson.exercises) + ",")
        for exercise in lesson.exercises:
            if exercise not in points:
                raise SystemExit(f"error: {exercise} is registered in lesson {lesson.number}'s "
                                 "lesson.toml but no grading test awards it points")
            steps.append(EXERCISE_STEP.format(n=lesson.number, exercise=exercise,
                                              points=points[exercise]))
            runners.append(exercise)
    env = "\n".join(f"          {r.upper()}_RESULTS: ${{{{ steps.{r}.outputs.result }}}}"
                    for r in runners)
    # One lesson a line: the reporter splits its runners at commas and white space.
    return HEADER.format(repo=repo, commit=commit) + "".join(steps) + REPORTER.format(env=env,
                                                     runners="\n".join(lines).rstrip(","))


def report(grades: Path, exercise: str, max_score: float) -> dict:
    """One exercise of a grading run, in the reporter's format: each test with its score."""
    tests = [t for t in graded_tests(grades) if t.exercise == exercise]
    earned = sum(t.earned for t in tests)
    possible = sum(t.points for t in tests)
    if tests and possible != max_score:  # the workflow is older than the grading tests
        print(f"::warning::{exercise}: the workflow says {max_score:g} points, the grader "
              f"gives {possible:g}: release again from step 1 (a new commit C)",
              file=sys.stderr)
    if not tests:
        entries = [{"name": exercise, "status": "error", "score": 0,
                    "message": f"{exercise} was not graded: see the lesson's grading step"}]
    else:
        entries = [{"name": f"{exercise}: {t.name}",
                    "status": "pass" if t.outcome == "passed" else "fail",
                    "score": number(t.earned), "message": t.message or None,
                    "test_code": f".venv/bin/pytest '{t.nodeid}'",
                    "filename": t.nodeid.split("::")[0], "line_no": 0, "duration": 0}
                   for t in tests]
    status = "pass" if tests and earned >= max_score else ("fail" if tests else "error")
    return {"version": 1, "status": status, "max_score": number(max_score), "tests": entries}


def number(points: float) -> int | float:
    """4.0 -> 4: the reporter prints what it is given."""
    return int(points) if float(points).is_integer() else points


def cmd_report(args) -> int:
    result = report(args.grades, args.exercise, args.max_score)
    for test in result["tests"]:  # the step's log, for the student
        mark = "passed" if test["status"] == "pass" else "NOT passed"
        print(f"{test['name']}: {mark} ({test['score']:g} points)", file=sys.stderr)
        if test.get("message"):
            print("    " + test["message"].replace("\n", "\n    "), file=sys.stderr)
    encoded = base64.b64encode(json.dumps(result).encode()).decode()
    print(f"result={encoded}")  # the step's output, for the reporter
    return 0


def cmd_check_grader(args) -> int:
    grader_pin(args.grader)
    return 0


def cmd_workflow(args) -> int:
    # both checked before the grading tests' collection, which takes seconds
    grader_pin(args.grader)
    graded_lessons(args.lesson)
    text = workflow_text(grader_points(), args.grader, args.lesson)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GitHub Classroom's autograding workflow.")
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("workflow", help="write the workflow from the grader's points")
    write.add_argument("--grader", required=True, help="owner/repo@commit of the student "
                       "release whose grader the workflow runs")
    write.add_argument("--out", type=Path, default=None, help="a file (default: stdout)")
    write.add_argument("--lesson", type=lesson_number, default=None,
                       help="grade this lesson alone (default: every graded lesson)")
    write.set_defaults(func=cmd_workflow)
    check = sub.add_parser("check-grader", help="fail, in one line, unless this is "
                           "owner/repo@commit (the system Python can run it: no .venv yet)")
    check.add_argument("grader")
    check.set_defaults(func=cmd_check_grader)
    one = sub.add_parser("report", help="one exercise's points, as the step output `result`")
    one.add_argument("grades", type=Path, help="the folder a grading run wrote")
    one.add_argument("exercise")
    one.add_argument("--max-score", type=float, required=True)
    one.set_defaults(func=cmd_report)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
