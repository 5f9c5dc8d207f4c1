"""The GitHub Classroom workflow a student release carries (`make student-release GRADER=...`).

It must be what Classroom reads (one workflow, one job, a reporter step adding up the
exercise steps), award exactly the grader's points, take its grader from the pinned
repository and commit alone, and run nothing of the student's push: its `run:` steps, run
here as GitHub runs them against a push whose own conftest.py, pyproject.toml and Makefile
are hostile, must give the honest points.
"""

import base64
import json
import re
import shutil
import subprocess
from xml.etree import ElementTree

import pytest
import yaml
from util import ROOT, run

from ddpcourse.course.classroom import grader_pin, grader_points, main, workflow_text
from ddpcourse.course.lessons import all_lessons, exercise_markers

pytestmark = pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                                reason="this copy of the course has no solutions/")

JOB = "run-autograding-tests"
REPORTER = "classroom-resources/autograding-grading-reporter@v1"
CHECKOUT = "actions/checkout@v4"
GRADER_REPO, GRADER_COMMIT = "course-org/ddp-course-template", "5f0c" * 10
PIN = f"{GRADER_REPO}@{GRADER_COMMIT}"
LESSON = 1  # its grading takes a few seconds here


def any_points_workflow():
    """A workflow written as `make classroom-workflow` writes it, with made-up points (the
    grader's own take a collection of the grading tests, seconds)."""
    return yaml.safe_load(workflow_text(dict.fromkeys(exercise_markers(), 1), PIN))


def job_steps(workflow):
    return workflow["jobs"][JOB]["steps"]


def exercise_steps(workflow):
    """exercise -> its step (the steps that report an exercise's points)."""
    return {step["id"]: step for step in job_steps(workflow)
            if "classroom report" in step.get("run", "")}


def max_score(step):
    return float(step["run"].split("--max-score")[1].split()[0])


def test_the_workflow_is_what_github_classroom_reads():
    workflow = any_points_workflow()
    # Classroom takes points only from this workflow name and this one job.
    assert workflow["name"] == "Autograding Tests"
    assert list(workflow["jobs"]) == [JOB]
    assert "push" in workflow["on"]
    reporter = job_steps(workflow)[-1]
    assert reporter["uses"] == REPORTER
    runners = [r for r in re.split(r"[\s,]+", reporter["with"]["runners"]) if r]
    # Every exercise is reported once, by a step of its own that the reporter reads.
    by_exercise = exercise_steps(workflow)
    assert runners == list(by_exercise) and len(set(runners)) == len(runners)
    assert set(runners) == set(exercise_markers())
    assert reporter["env"] == {f"{r.upper()}_RESULTS": f"${{{{ steps.{r}.outputs.result }}}}"
                               for r in runners}
    lesson_of = {e: lesson.number for lesson in all_lessons() for e in lesson.exercises}
    for exercise, step in by_exercise.items():
        words = step["run"].split()
        assert words[words.index("report") + 1:words.index("report") + 3] == [
            f'"$GRADES/lesson{lesson_of[exercise]}"', exercise], step
        assert step["if"] == "${{ !cancelled() }}"  # a failed lesson costs only its own points


@pytest.mark.parametrize("lesson", [1, 4, 10])
def test_a_workflow_for_one_lesson_grades_that_lesson_alone(lesson):
    """An assignment per lesson: its push grades only that lesson's exercises, pinned as ever."""
    workflow = yaml.safe_load(workflow_text(dict.fromkeys(exercise_markers(), 1), PIN, lesson))
    ours = list(next(item for item in all_lessons() if item.number == lesson).exercises)
    assert list(exercise_steps(workflow)) == ours
    grading_runs = [step for step in job_steps(workflow)
                    if "--submission ../student" in step.get("run", "")]
    assert len(grading_runs) == 1 and f"--lesson {lesson} " in grading_runs[0]["run"], grading_runs
    runners = [r for r in re.split(r"[\s,]+", job_steps(workflow)[-1]["with"]["runners"]) if r]
    assert runners == ours
    only_the_pinned_grader_runs(workflow)


def test_a_workflow_for_a_lesson_without_exercises_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["workflow", "--grader", PIN, "--lesson", "2"])
    assert "LESSON=2: no graded lesson" in str(ended.value)


def only_the_pinned_grader_runs(workflow, repo=GRADER_REPO, commit=GRADER_COMMIT):
    """The grader is checked out from exactly the pin, the push into student/, and no step
    runs or reads student/ except through the grader's --submission."""
    checkouts = [step for step in job_steps(workflow) if step.get("uses") == CHECKOUT]
    push, grader = (next(s["with"] for s in checkouts if s["with"]["path"] == path)
                    for path in ("student", "grader"))
    assert len(checkouts) == 2
    assert "repository" not in push and "ref" not in push  # the push itself
    assert (grader["repository"], grader["ref"]) == (repo, commit)
    run_steps = [step for step in job_steps(workflow) if "run" in step]
    assert run_steps
    for step in run_steps:
        assert step.get("working-directory") == "grader" or step["run"].startswith(
            "make -C grader "), step
        assert "student" not in step["run"].replace("--submission ../student", ""), step
    # No step depends on what the push holds (as the self-check on solutions/ did).
    assert not [s for s in job_steps(workflow) if "hashFiles" in str(s) or "solutions" in str(s)]


def test_the_grader_is_the_pinned_commit_and_nothing_of_the_push_runs():
    only_the_pinned_grader_runs(any_points_workflow())


@pytest.mark.parametrize("grader", ["", "course-org/template", "course-org/template@main",
                                    f"course-org/template@{GRADER_COMMIT[:12]}",
                                    f"course-org@{GRADER_COMMIT}", f"-x/template@{GRADER_COMMIT}",
                                    f"course-org/..@{GRADER_COMMIT}"])
def test_a_grader_that_is_not_a_pinned_repository_is_refused_in_one_line(grader, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["check-grader", "--", grader])
    assert str(refused.value).startswith(f"error: GRADER={grader!r}: use owner/repo@commit")
    assert "\n" not in str(refused.value)
    assert grader_pin(PIN) == (GRADER_REPO, GRADER_COMMIT)


def test_make_refuses_a_bad_grader_before_it_installs_anything(tmp_path):
    refused = run(["make", "--no-print-directory", "classroom-workflow", "GRADER=org/repo@v1",
                   f"VENV={tmp_path / 'venv'}"], timeout=60)
    assert refused.returncode != 0
    assert refused.stderr.splitlines()[0].startswith("error: GRADER='org/repo@v1'")
    assert not (tmp_path / "venv").exists()


def test_every_make_target_the_workflow_runs_exists():
    named = {target for step in job_steps(any_points_workflow())
             for target in re.findall(r"\bmake -C grader ([a-z0-9-]+)", step.get("run", ""))}
    assert named  # the grader is set up the way students set the course up
    for target in named:  # the grader is a student release of this checkout: the same Makefile
        dry = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, f"make {target}: {dry.stderr}"


@pytest.fixture(scope="module")
def grader(tmp_path_factory):
    """A student release of this checkout, as the instructor pushes it, with its workflow
    pinned to it; its .venv is the course's own (for `make -C grader setup`)."""
    release = tmp_path_factory.mktemp("workspace") / "grader"
    made = run(["make", "--no-print-directory", "student-release", f"RELEASE={release}",
                f"GRADER={PIN}"], timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    assert not (release / "solutions").exists()
    (release / ".venv").symlink_to(ROOT / ".venv")
    return release


def released_workflow(grader):
    return yaml.safe_load((grader / ".github" / "workflows" / "classroom.yml").read_text())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_released_workflow_awards_the_graders_points(grader):
    workflow = released_workflow(grader)
    only_the_pinned_grader_runs(workflow)
    points = grader_points()
    steps = exercise_steps(workflow)
    assert set(steps) == set(points)
    for exercise, step in steps.items():
        assert max_score(step) == points[exercise], exercise
        assert step["name"] == f"{exercise}: {points[exercise]:g} points"


HOSTILE_CONFTEST = '''\
"""Every test report passes, if pytest ever loads this file."""
import pathlib

import pytest

pathlib.Path(__file__).with_name("conftest-ran").touch()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
'''


def hostile_push(folder, exercises):
    """A student's push: `exercises` as lesson 1's exercises.py, and files that would decide
    the points if anything of the push but its exercise files ran."""
    (folder / "lessons" / f"lesson{LESSON}").mkdir(parents=True)
    (folder / "lessons" / f"lesson{LESSON}" / "exercises.py").write_text(exercises)
    (folder / "tests").mkdir()
    (folder / "tests" / "conftest.py").write_text(HOSTILE_CONFTEST)
    (folder / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = "-p no:junitxml -p no:timeout"\n')
    (folder / "Makefile").write_text("setup grade:\n\ttouch make-ran; exit 1\n")
    (folder / "requirements.txt").write_text("no-such-package-of-the-student\n")
    return folder


def run_lesson_steps(workflow, workspace):
    """Run the workflow's `run:` steps for one lesson here as GitHub runs them (bash -eo
    pipefail, in the step's working-directory, GITHUB_OUTPUT and GITHUB_ENV as files);
    `make -C grader setup` is the .venv the grader fixture links. {step id: its outputs}."""
    runs = [step for step in job_steps(workflow) if "run" in step]
    chosen = [step for step in runs if f"--lesson {LESSON} " in step["run"]
              or f'"$GRADES/lesson{LESSON}"' in step["run"]]
    assert "make -C grader setup" in [step["run"] for step in runs if step not in chosen]
    env = {"GITHUB_WORKSPACE": str(workspace), "COURSE_JOB_CACHE": "",
           **workflow["jobs"][JOB]["env"]}
    outputs = {}
    for step in chosen:
        github_env, github_output = workspace / "github_env", workspace / "github_output"
        github_env.write_text("")
        github_output.write_text("")
        done = run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                   cwd=workspace / step.get("working-directory", "."),
                   env={**env, "GITHUB_ENV": str(github_env), "GITHUB_OUTPUT": str(github_output)},
                   timeout=200)
        assert done.returncode == 0, (step["name"], (done.stdout + done.stderr)[-3000:])
        env.update(line.split("=", 1) for line in github_env.read_text().splitlines())
        outputs[step.get("id")] = dict(line.split("=", 1)
                                       for line in github_output.read_text().splitlines())
    return {step["id"]: (step, json.loads(base64.b64decode(outputs[step["id"]]["result"])))
            for step in chosen if "id" in step}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("exercises, full_marks", [
    pytest.param(ROOT / "solutions" / f"lesson{LESSON}" / "exercises.py", True, id="solution"),
    pytest.param(ROOT / "lessons" / f"lesson{LESSON}" / "exercises.py", False, id="stub")])
def test_a_hostile_push_gets_the_honest_points(grader, exercises, full_marks):
    workspace = grader.parent
    student = workspace / "student"
    for earlier in (student, grader / "build"):  # the other parametrisation's push and grades
        shutil.rmtree(earlier, ignore_errors=True)
    hostile_push(student, exercises.read_text())
    reported = run_lesson_steps(released_workflow(grader), workspace)
    assert reported
    for exercise, (step, result) in reported.items():
        assert result["max_score"] == max_score(step) > 0
        earned = sum(test["score"] for test in result["tests"])
        assert earned == (max_score(step) if full_marks else 0), (exercise, result)
        assert result["status"] == ("pass" if full_marks else "fail"), result
    assert not (student / "tests" / "conftest-ran").exists()
    assert not (student / "make-ran").exists()


def test_a_step_reports_the_points_each_test_earned(tmp_path, capsys):
    """Partial credit: the reporter adds up the tests' scores, so a mistake costs what the
    grader says it costs, and the student reads why."""
    graded = tmp_path / "grades"
    graded.mkdir()
    lesson1 = "tests/grading/test_lesson1.py"
    (graded / "results.json").write_text(json.dumps({"tests": {
        f"{lesson1}::test_right": {"exercise": "l1_global_rank", "points": 2, "outcome": "passed"},
        f"{lesson1}::test_wrong": {"exercise": "l1_global_rank", "points": 1, "outcome": "failed"},
        f"{lesson1}::test_killed": {"exercise": "l1_global_rank", "points": 1,
                                    "outcome": "crashed"},
        f"{lesson1}::test_other": {"exercise": "l1_identity", "points": 6, "outcome": "passed"}}}))
    suite = ElementTree.Element("testsuite")
    for name in ("test_right", "test_wrong", "test_killed", "test_other"):
        case = ElementTree.SubElement(suite, "testcase", classname="tests.grading.test_lesson1",
                                      name=name)
        if name == "test_wrong":
            ElementTree.SubElement(case, "failure", message="assert 3 == 1").text = (
                f"{lesson1}:57: in test_wrong\n    assert rank == 1\nE   assert 3 == 1\n"
                "E     Use -v to get more diff")
        if name == "test_killed":
            ElementTree.SubElement(case, "failure", message="killed the grading process")
    ElementTree.ElementTree(suite).write(graded / "junit.xml")
    assert main(["report", str(graded), "l1_global_rank", "--max-score", "4"]) == 0
    printed = capsys.readouterr()
    result = json.loads(base64.b64decode(printed.out.strip().removeprefix("result=")))
    assert result["max_score"] == 4 and result["status"] == "fail"
    scores = {test["name"]: test["score"] for test in result["tests"]}
    assert scores == {"l1_global_rank: test_right": 2, "l1_global_rank: test_wrong": 0,
                      "l1_global_rank: test_killed": 0}
    said = {test["name"]: test["message"] for test in result["tests"]}
    assert "E   assert 3 == 1" in said["l1_global_rank: test_wrong"]
    assert "Use -v" not in said["l1_global_rank: test_wrong"]
    assert "ended the grading process" in said["l1_global_rank: test_killed"]
    assert "test_wrong: NOT passed" in printed.err  # the step's log
