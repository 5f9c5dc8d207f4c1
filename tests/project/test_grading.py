"""The grader, both ways: full marks on the solutions, zero on the stubs, and robust to bad code."""

import ast
import json
import os
import re
import shutil
import uuid
from xml.etree import ElementTree

import pytest
from util import PYTHON, ROOT, by_lesson, group_fails, run

from ddpcourse.course.grading import junit_address, run_grading, summarise
from ddpcourse.course.lessons import exercise_markers
from ddpcourse.course.sandbox_child import FORM_TRIES

# These are the instructor's checks of the grader itself; a student copy has no solutions.
pytestmark = pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                                reason="this copy of the course has no solutions/")

LESSONS = sorted(int(p.name[len("lesson"):]) for p in (ROOT / "lessons").glob("lesson*")
                 if (p / "exercises.py").exists())


def scores(tests):
    return {name: (s["earned"], s["possible"]) for name, s in summarise(tests).items()}


def failures(junit):
    """What the failed tests of a grading run said (from its junit.xml)."""
    tree = ElementTree.parse(junit)
    return [f"{case.get('name')}: {(problem.text or problem.get('message') or '')[-1500:]}"
            for case in tree.iter("testcase") for problem in case
            if problem.tag in ("failure", "error")]


def registered_exercise_markers():
    return set(exercise_markers())


@pytest.mark.slow
@pytest.mark.timeout(300)
# lessons 6 and 7's gradings run restarted and relayed jobs (half a minute each): make test-grading
@pytest.mark.parametrize("lesson", by_lesson(LESSONS, apart=(6, 7)))
def test_solutions_get_full_marks_and_stubs_get_zero(tmp_path, lesson):
    # One lesson per test, so that a parallel run (make test) spreads their launches.
    solutions = run_grading(lesson, tmp_path / "solutions", impl="solutions", quiet=True)
    stubs = run_grading(lesson, tmp_path / "stubs", impl="student", quiet=True)
    assert solutions and stubs
    assert set(solutions) == set(stubs)
    full = scores(solutions)
    assert all(earned == possible > 0 for earned, possible in full.values()), \
        (full, failures(tmp_path / "solutions" / "junit.xml"))
    assert all(earned == 0 for earned, _ in scores(stubs).values()), scores(stubs)
    # Every exercise the lesson registers is graded, and nothing else.
    assert set(full) == {m for m in registered_exercise_markers() if m.startswith(f"l{lesson}_")}
    junit = (tmp_path / "stubs" / "junit.xml").read_text()
    assert junit.count("<testcase") == len(stubs)
    saved = json.loads((tmp_path / "solutions" / "results.json").read_text())
    assert saved["scores"] == summarise(solutions)


def test_every_lesson_with_exercises_registers_them():
    markers = registered_exercise_markers()
    assert {int(re.match(r"l(\d+)_", name).group(1)) for name in markers} == set(LESSONS)


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_stub_raises_not_implemented_and_solutions_define_them(lesson):
    stub_tree = ast.parse((ROOT / "lessons" / f"lesson{lesson}" / "exercises.py").read_text())
    stubs = [f for f in stub_tree.body if isinstance(f, ast.FunctionDef)
             and not f.name.startswith("_")]
    assert stubs
    for func in stubs:
        raised = [n for n in ast.walk(func) if isinstance(n, ast.Raise)]
        assert any("NotImplementedError" in ast.unparse(r) for r in raised), func.name
    solution_tree = ast.parse((ROOT / "solutions" / f"lesson{lesson}" / "exercises.py")
                              .read_text())
    solved = {f.name for f in solution_tree.body if isinstance(f, ast.FunctionDef)}
    assert {f.name for f in stubs} <= solved


BAD_SUBMISSION = '''
import os, sys, time
from solutions_copy import *  # noqa: the parts not tested below stay correct

def rank_layout(nodes, gpus_per_node, gpus_per_process=1):
    os._exit(3)               # ends its process outright

def node_groups(nodes, procs_per_node):
    while True:               # never returns
        time.sleep(0.01)

def identity_from_env(environ):
    sys.exit("I give up")     # a polite exit
'''


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_crashing_hanging_and_exiting_code_scores_zero_and_grading_finishes(tmp_path):
    submission = tmp_path / "alice" / "lesson1"
    submission.mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / "lesson1" / "exercises.py", submission / "solutions_copy.py")
    (submission / "exercises.py").write_text(
        "import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\n"
        + BAD_SUBMISSION)
    result = run([PYTHON, "-m", "ddpcourse.course.grading", "grade", "--lesson", "1",
                  "--submission", str(tmp_path / "alice"), "--out", str(tmp_path / "out")],
                 env={"COURSE_TEST_TIMEOUT": "3"}, timeout=220)
    assert result.returncode == 0, result.stderr[-2000:]
    tests = json.loads((tmp_path / "out" / "results.json").read_text())["tests"]
    got = scores(tests)
    assert got["l1_global_rank"][0] == got["l1_global_rank"][1] > 0
    assert got["l1_rank_layout"][0] == 0
    assert got["l1_node_groups"][0] == 0
    assert got["l1_identity"][0] == 0
    # Its code ran in its sandbox, never in the grading process: each exit or hang failed the
    # test it was serving, with the reason, and the next test started a fresh sandbox.
    assert {t["outcome"] for t in tests.values()} == {"passed", "failed"}
    assert "killed the grading process" not in result.stderr
    assert "TOTAL" in result.stdout
    cases = {junit_address(n): None for n in tests}
    for case in ElementTree.parse(tmp_path / "out" / "junit.xml").iter("testcase"):
        cases[(case.get("classname"), case.get("name"))] = case
    assert len(cases) == len(tests) and None not in cases.values()
    failures = {}
    for nodeid, test in tests.items():
        failure = cases[junit_address(nodeid)].find("failure")
        assert (failure is not None) == (test["outcome"] == "failed"), nodeid
        if failure is not None:
            failures[nodeid] = failure.get("message", "") + (failure.text or "")
    layout = [text for nodeid, text in failures.items() if "layout" in nodeid]
    assert layout and all("ended its process (exit status 3)" in text for text in layout)
    assert any("I give up" in text for nodeid, text in failures.items() if "identity" in nodeid)


def test_bad_grading_requests_are_one_line_errors(tmp_path):
    result = run([PYTHON, "-m", "ddpcourse.course.grading", "grade", "--lesson", "99"], timeout=30)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("error: lesson 99 has no graded")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run([PYTHON, "-m", "ddpcourse.course.grading", "class", str(empty)], timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {empty} holds no submission folders"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_student_release_has_no_solutions_and_its_grader_runs(tmp_path):
    release = tmp_path / "release"
    # What lies in the checkout untracked (a class's submissions, say) is not released.
    kept = ROOT / f"class-kept-untracked-{uuid.uuid4().hex[:8]}"
    (kept / "alice" / "lesson1").mkdir(parents=True)
    (kept / "alice" / "lesson1" / "exercises.py").write_text("# alice's lesson 1\n")
    try:
        result = run(["make", "--no-print-directory", "student-release", f"RELEASE={release}"],
                     timeout=60)
    finally:
        shutil.rmtree(kept)
    assert result.returncode == 0, result.stderr
    assert not (release / kept.name).exists()
    assert not (release / "solutions").exists()
    # Without GRADER no Classroom workflow: one would grade with a grader the push can change.
    assert not (release / ".github" / "workflows" / "classroom.yml").exists()
    assert "make student-release GRADER=owner/repo@commit" in result.stdout
    # the wrong submissions hold right answers too (a few on purpose, most nearly)
    assert not (release / "tests" / "project" / "wrong_submissions").exists()
    assert (release / "lessons" / "lesson1" / "exercises.py").exists()
    assert not list(release.rglob("*solution*.py"))
    # No job cache: installing it imports this checkout's ddpcourse before the release's own.
    alone = {"COURSE_JOB_CACHE": ""}
    graded = run([PYTHON, "-m", "ddpcourse.course.grading", "grade", "--lesson", "1"], cwd=release,
                 timeout=100, env=alone)
    assert graded.returncode == 0, graded.stderr[-2000:]
    assert re.search(r"TOTAL\s+0 / \d+", graded.stdout)
    asked = run([PYTHON, "-m", "ddpcourse.course.grading", "grade", "--lesson", "1", "--impl",
                 "solutions"], cwd=release, timeout=100, env=alone)
    assert "has no solutions" in asked.stdout + asked.stderr


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_without_root_the_sandbox_is_a_process_of_its_own_and_grades_the_same(tmp_path):
    """On a laptop (no root), the submission still runs apart from the judge, under the same
    user, with a network, /tmp, /dev/shm and home of its own where the kernel lends user
    namespaces (tests/grading/README.md says what that does not protect); the grading says
    in one line which isolation it used. What the submission writes in /tmp and /dev/shm
    is gone with it."""
    submission = tmp_path / "probe" / "lesson1"
    submission.mkdir(parents=True)
    marker = f"course-isolation-{os.getpid()}"
    (submission / "exercises.py").write_text(
        (ROOT / "solutions" / "lesson1" / "exercises.py").read_text()
        + f"\nfor _place in ('/tmp', '/dev/shm'):\n"
          f"    open(_place + '/{marker}', 'w').write('left by the submission')\n")
    result = run([PYTHON, "-m", "ddpcourse.course.grading", "grade", "--lesson", "1",
                  "--submission", str(submission.parent), "--out", str(tmp_path / "out")],
                 env={"COURSE_SANDBOX_NO_ROOT": "1", "COURSE_SANDBOX_ZYGOTE": ""}, timeout=170)
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads((tmp_path / "out" / "results.json").read_text())["scores"]
    assert all(s["earned"] == s["possible"] > 0 for s in scores.values()), scores
    said = [line for line in result.stdout.splitlines() if line.startswith("isolation: ")]
    assert len(said) == 1, result.stdout[-2000:]
    if said[0].startswith("isolation: user namespaces"):
        left = [p for p in (f"/tmp/{marker}", f"/dev/shm/{marker}") if os.path.exists(p)]
        assert not left, f"the submission's files outlived it: {left}" + result.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_check_whose_group_fails_to_form_tries_again_at_no_cost(tmp_path):
    """Every launch of this submission's job fails to form its first group twice, on every
    rank: its ranks try again together, and a right answer keeps its marks."""
    marks = group_fails(tmp_path / "bob" / "lesson1", times=FORM_TRIES - 1, every_launch=True)
    try:
        result = run([PYTHON, "-m", "ddpcourse.course.grading", "grade", "--lesson", "1",
                      "--submission", str(tmp_path / "bob"), "--out", str(tmp_path / "out")],
                     timeout=170)
    finally:
        for mark in marks():  # left in this machine's /tmp where no sandbox had its own
            mark.unlink()
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads((tmp_path / "out" / "results.json").read_text())["scores"]
    assert all(s["earned"] == s["possible"] > 0 for s in scores.values()), scores


@pytest.mark.slow
@pytest.mark.grading_heavy
@pytest.mark.timeout(240)
def test_the_one_retry_is_the_graders_own_and_is_recorded(tmp_path):
    """A job whose check's own group never forms in all its tries is launched again from that
    check, and the retry is written in results.json and the JUnit report; a job the
    submission's code ends is never tried again: the check it ended in scores zero, the other
    checks run in a fresh job and keep their points."""
    marks = group_fails(tmp_path / "bob" / "lesson1", times=FORM_TRIES, every_launch=False)
    ends = tmp_path / "carol" / "lesson1"
    ends.mkdir(parents=True)
    ends.joinpath("exercises.py").write_text(
        (ROOT / "solutions" / "lesson1" / "exercises.py").read_text()
        + "\n\nimport os\n\n\ndef identity_from_env(environ):\n    os._exit(3)\n")
    graded = {}
    try:
        for student in ("bob", "carol"):
            out = tmp_path / "out" / student
            result = run([PYTHON, "-m", "ddpcourse.course.grading", "grade", "--lesson", "1",
                          "--submission", str(tmp_path / student), "--out", str(out)],
                         timeout=110)
            assert result.returncode == 0, result.stderr[-2000:]
            graded[student] = (json.loads((out / "results.json").read_text()),
                               ElementTree.parse(out / "junit.xml"))
    finally:
        for mark in marks():
            mark.unlink()
    bob, bob_junit = graded["bob"]
    assert all(s["earned"] == s["possible"] > 0 for s in bob["scores"].values()), bob["scores"]
    assert len(bob["retries"]) == 1 and "never formed" in bob["retries"][0], bob["retries"]
    said = [p.get("value") for p in bob_junit.iter("property") if p.get("name") == "retry"]
    assert said == bob["retries"]
    carol, carol_junit = graded["carol"]
    assert carol["retries"] == [] and not list(carol_junit.iter("property"))
    earned = {e: s["earned"] for e, s in carol["scores"].items()}
    assert earned == {"l1_global_rank": 4, "l1_rank_layout": 6, "l1_node_groups": 4,
                      "l1_identity": 0}, earned
