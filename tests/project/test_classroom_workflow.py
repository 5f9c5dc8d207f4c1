"""The GitHub Classroom workflow the student release carries (.github/workflows/classroom.yml).

It must be what Classroom reads (one workflow, one job, a reporter step adding up the
exercise steps), name only make targets and exercises that exist, award exactly the grader's
points (it is written from them by `make classroom-workflow`), and its commands, run here as
GitHub runs them, must give the reference solutions full marks.
"""

import base64
import json
import re
import subprocess
from xml.etree import ElementTree

import pytest
import yaml
from util import PYTHON, ROOT, run

from ddpcourse.course.classroom import WORKFLOW, grader_points, main, workflow_text
from ddpcourse.course.lessons import all_lessons, exercise_markers

pytestmark = pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                                reason="this copy of the course has no solutions/")

JOB = "run-autograding-tests"
REPORTER = "classroom-resources/autograding-grading-reporter@v1"
LESSON = 1  # its grading takes about 4 s here


def steps():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    return workflow["jobs"][JOB]["steps"]


def exercise_steps():
    """exercise -> its step (the steps that report an exercise's points)."""
    return {step["id"]: step for step in steps() if "classroom report" in step.get("run", "")}


def test_the_workflow_is_what_github_classroom_reads():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    # Classroom takes points only from this workflow name and this one job.
    assert workflow["name"] == "Autograding Tests"
    assert list(workflow["jobs"]) == [JOB]
    assert "push" in workflow["on"]
    reporter = workflow["jobs"][JOB]["steps"][-1]
    assert reporter["uses"] == REPORTER
    runners = [r for r in re.split(r"[\s,]+", reporter["with"]["runners"]) if r]
    # Every exercise is reported once, by a step of its own that the reporter reads.
    by_exercise = exercise_steps()
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


def test_every_make_target_the_workflow_runs_exists():
    named = {target for step in steps()
             for target in re.findall(r"\bmake ([a-z0-9-]+)", step.get("run", ""))}
    assert named  # the course is set up the way students set it up
    for target in named:
        dry = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, f"make {target}: {dry.stderr}"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_workflow_awards_the_graders_points_and_is_up_to_date():
    points = grader_points()
    for exercise, step in exercise_steps().items():
        max_score = float(step["run"].split("--max-score")[1].split()[0])
        assert max_score == points[exercise], f"{exercise}: run make classroom-workflow"
        assert step["name"] == f"{exercise}: {points[exercise]:g} points"
    assert WORKFLOW.read_text() == workflow_text(points), \
        "the workflow is older than the grading tests: run make classroom-workflow"


def run_steps(chosen, tmp_path):
    """Run workflow steps here as GitHub runs them (bash -eo pipefail, $GITHUB_ENV carried
    to the later steps); returns {step id: its outputs}."""
    env = {"GRADES": str(tmp_path / "grades")}
    outputs = {}
    for step in chosen:
        github_env, github_output = tmp_path / "env", tmp_path / "output"
        github_env.write_text("")
        github_output.write_text("")
        # the fork server's stand-in for the venv's interpreter: the same Python, started fast
        script = step["run"].replace(".venv/bin/python", PYTHON)
        done = run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                   env={**env, "GITHUB_ENV": str(github_env), "GITHUB_OUTPUT": str(github_output),
                        "COURSE_JOB_CACHE": ""}, timeout=200)
        assert done.returncode == 0, (step["name"], (done.stdout + done.stderr)[-3000:])
        env.update(line.split("=", 1) for line in github_env.read_text().splitlines())
        outputs[step.get("id")] = dict(line.split("=", 1)
                                       for line in github_output.read_text().splitlines())
    return env, outputs


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_workflow_gives_the_reference_full_marks(tmp_path):
    all_steps = steps()
    start = next(i for i, s in enumerate(all_steps) if s.get("name") == "Which exercises to grade")
    graded = next(i for i, s in enumerate(all_steps)
                  if s.get("name", "").startswith(f"Lesson {LESSON}: grade"))
    reports = [s for s in all_steps[graded + 1:] if s.get("id", "").startswith(f"l{LESSON}_")]
    assert reports
    env, outputs = run_steps([all_steps[start], all_steps[graded], *reports], tmp_path)
    assert env["IMPL"] == "solutions"  # this copy has them; a student's has not
    for step in reports:
        result = json.loads(base64.b64decode(outputs[step["id"]]["result"]))
        max_score = float(step["run"].split("--max-score")[1].split()[0])
        assert result["max_score"] == max_score > 0
        assert result["status"] == "pass", result
        assert sum(test["score"] for test in result["tests"]) == max_score, result


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
