"""`make grade-class`: every student scored exactly as grading them alone scores them,
whatever the others' code does (ddpcourse/course/grading.py's cmd_class: a judge and a sandbox
per student); and the batched launches the project's own tests use to grade their wrong
submissions (ddpcourse/course/batched_jobs.py)."""

import csv
import json
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from util import PYTHON, ROOT, run

from ddpcourse.cluster import slurm
from ddpcourse.course import batched_jobs, grading
from ddpcourse.course.grading import run_grading, summarise
from ddpcourse.course.job_checks import STATE

pytestmark = pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                                reason="this copy of the course has no solutions/")


def fake_worker(launches):
    """A stand-in for batched_jobs.launch_for: grades the folders in turn as a worker does
    (announce, say how far it got, then report); a folder named dies* ends the job in its one
    check (exit status 1), hangs* is stopped there at its time limit (124). Records every
    launch's folders."""
    def launch_for(job, folders, work, skip=()):
        launches.append([f.rsplit("/", 1)[-1] for f in folders])
        observed = Path(tempfile.mkdtemp(dir=work))
        result = subprocess.CompletedProcess(folders, 0, "", "")
        result.observed = lambda i: str(observed / f"{i}.pt")
        for i, folder in enumerate(folders):
            result.stdout += f"### submission {folder}\n"
            name = folder.rsplit("/", 1)[-1]
            state = {"planned": ["check"], "imported": True, "running": "check"}
            if name.startswith(("dies", "hangs")):
                torch.save({STATE: state}, result.observed(i))
                result.returncode = 1 if name.startswith("dies") else 124
                result.stderr = f"{name} stopped\n"
                return result
            torch.save({"check": [{"data": name}] * 2, STATE: dict(state, running=None)},
                       result.observed(i))
            result.stdout += f"check: ok for {name}\n"
        return result
    return launch_for


def test_a_submission_that_stops_the_job_is_graded_alone_and_costs_no_one_else(
        monkeypatch, tmp_path):
    launches = []
    monkeypatch.setattr(batched_jobs, "launch_for", fake_worker(launches))
    folders = [f"/class/{name}" for name in ("ann", "dies1", "ben", "hangs", "cy")]
    said = []
    shares = batched_jobs.shares_of(SimpleNamespace(name="lesson9_W2", nproc=2, nnodes=1),
                                    folders, tmp_path, say=said.append)
    # the whole class; dies1 alone; the rest; hangs alone; the one after it
    assert launches == [["ann", "dies1", "ben", "hangs", "cy"], ["dies1"],
                        ["ben", "hangs", "cy"], ["hangs"], ["cy"]]
    for name in ("ann", "ben"):  # their reports, as the job printed them
        assert shares[f"/class/{name}"].stdout == f"\ncheck: ok for {name}\n"
    assert shares["/class/cy"].stdout == "### submission /class/cy\ncheck: ok for cy\n"
    # each its own observations; the check a submission ended scores as ended, not retried
    for name in ("ann", "ben", "cy"):
        seen = torch.load(shares[f"/class/{name}"].observations, weights_only=True)
        assert seen["check"] == [{"data": name}] * 2
    for name in ("dies1", "hangs"):
        seen = torch.load(shares[f"/class/{name}"].observations, weights_only=True)
        assert all("ended" in rank["error"] for rank in seen["check"]), seen
    # the guilty get what a job of their own gave them
    assert shares["/class/dies1"].returncode == 1
    assert shares["/class/dies1"].stderr == "dies1 stopped\n"
    assert shares["/class/hangs"].returncode == 124
    assert not any(share.not_graded for share in shares.values())
    assert len(said) == 2 and "stopped (exit status 1) in /class/dies1" in said[0]


def test_a_job_that_stops_before_any_submission_grades_no_one(monkeypatch, tmp_path):
    launches = []

    def broken(job, folders, work, skip=()):
        launches.append(folders)
        return subprocess.CompletedProcess(folders, 1, "", "torchrun: no such port\n")

    monkeypatch.setattr(batched_jobs, "launch_for", broken)
    shares = batched_jobs.shares_of(SimpleNamespace(name="lesson9_W2"), ["/a", "/b", "/c"],
                                    tmp_path, say=lambda line: None)
    assert len(launches) == 1  # no one to blame: no one is relaunched
    assert {share.not_graded for share in shares.values()} == {
        "job lesson9_W2 stopped before it began any submission (exit status 1): "
        "torchrun: no such port"}


def test_a_restarted_job_reports_each_submission_from_its_last_announcement():
    """Lesson 6: every drill is announced, then every resume; a restart in the middle of b's
    resume announces b again."""
    stdout = ("### drill /a\n### drill /b\n### submission /a\nresume: ok\n"
              "### submission /b\n### submission /b\nresume: ok\nprinted by /b's code\n")
    reports, finished, stopped_in = batched_jobs.read_announcements(stdout, ["/a", "/b"])
    assert reports == {"/a": "\nresume: ok\n", "/b": "\nresume: ok\nprinted by /b's code\n"}
    assert finished == {"/a"} and stopped_in == "/b"
    _, finished, stopped_in = batched_jobs.read_announcements("### drill /a\n### drill /b\n",
                                                              ["/a", "/b"])
    assert finished == set() and stopped_in == "/b"


def test_a_student_not_graded_has_empty_cells_and_a_reason(monkeypatch, tmp_path):
    for student in ("ann", "bob"):  # each hands in something (an empty folder is missing)
        (tmp_path / "class" / student / "lesson1").mkdir(parents=True)
        (tmp_path / "class" / student / "lesson1" / "exercises.py").write_text("")
    ann_tests = {"t1": {"exercise": "l1_identity", "points": 3.0, "outcome": "passed"},
                 "t2": {"exercise": "l1_global_rank", "points": 2.0, "outcome": "failed"}}

    def graded(lesson, students, out, timeout, workers, exercise=None):
        return {students[0]: (ann_tests, ""), students[1]: ({}, "job lesson1_W4 stopped")}

    monkeypatch.setattr(grading, "grade_lesson_of_class", graded)
    out_csv = tmp_path / "class.csv"
    assert grading.main(["class", str(tmp_path / "class"), "--lesson", "1",
                         "--csv", str(out_csv), "--out", str(tmp_path / "out")]) == 0
    ann, bob = csv.DictReader(out_csv.open())
    assert (ann["l1_identity"], ann["l1_global_rank"], ann["l1_node_groups"]) == ("3", "0", "")
    assert (ann["total"], ann["status"]) == ("3", "graded")
    assert bob["l1_identity"] == bob["total"] == ""
    assert bob["status"] == "not graded: lesson 1: job lesson1_W4 stopped"


DIES_UNDER_TORCHRUN = '''

import os  # noqa: E402

_reference_identity = identity_from_env


def identity_from_env(environ):
    if "TORCHELASTIC_RUN_ID" in os.environ:  # in the grading job only: every rank exits
        os._exit(3)
    return _reference_identity(environ)
'''


@pytest.mark.slow
@pytest.mark.grading_heavy  # make test-grading: a class of lesson 1, graded twice
@pytest.mark.timeout(300)
def test_a_class_is_scored_as_grading_each_student_alone(tmp_path):
    klass = tmp_path / "class"
    solution = (ROOT / "solutions" / "lesson1" / "exercises.py").read_text()
    for student in ("bob", "carol", "dave"):
        (klass / student / "lesson1").mkdir(parents=True)
    # bob's code ends every rank of his grading job
    (klass / "bob" / "lesson1" / "exercises.py").write_text(solution + DIES_UNDER_TORCHRUN)
    # carol solved one exercise; dave all of them: both come after bob
    stubs = (ROOT / "lessons" / "lesson1" / "exercises.py").read_text()
    (klass / "carol" / "lesson1" / "exercises.py").write_text(stubs.replace(
        'raise NotImplementedError("l1_global_rank: compute the global rank")',
        "if min(node_rank, local_rank) < 0 or not 0 <= local_rank < procs_per_node:\n"
        "        raise ValueError('no such process')\n"
        "    return node_rank * procs_per_node + local_rank"))
    shutil.copy(ROOT / "solutions" / "lesson1" / "exercises.py", klass / "dave" / "lesson1")
    out_csv, out = tmp_path / "class.csv", tmp_path / "runs"
    result = run([PYTHON, "-m", "ddpcourse.course.grading", "class", str(klass), "--lesson", "1",
                  "--csv", str(out_csv), "--out", str(out)], timeout=280)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "lesson 1: 3 submissions in " in result.stdout
    assert "3 submissions, 1 lesson, in " in result.stdout

    def alone(student):
        return summarise(run_grading(1, tmp_path / "alone" / student,
                                     submission=str(klass / student), quiet=True))

    students = ["bob", "carol", "dave"]
    with ThreadPoolExecutor(2) as pool:  # mostly importing torch: one at a time per core
        by_themselves = dict(zip(students, pool.map(alone, students), strict=True))
    rows = {row["student"]: row for row in csv.DictReader(out_csv.open())}
    assert list(rows) == students
    for student in students:
        in_class = json.loads((out / student / "lesson1" / "results.json").read_text())
        assert in_class["scores"] == by_themselves[student], student
        assert (out / student / "lesson1" / "junit.xml").exists()
        row = rows[student]
        assert row["status"] == "graded"
        assert {e: float(row[e]) for e in in_class["scores"]} == {
            e: s["earned"] for e, s in in_class["scores"].items()}
    points = {s: {e: v["earned"] for e, v in by_themselves[s].items()} for s in students}
    assert all(v["earned"] == v["possible"] for v in by_themselves["dave"].values())
    assert 0 < points["bob"]["l1_identity"] < by_themselves["bob"]["l1_identity"]["possible"]
    assert points["carol"]["l1_global_rank"] > 0 and points["carol"]["l1_identity"] == 0


# --- a SLURM job array on the course's own cluster (lesson 5's) ----------------------------

NO_SLURM = slurm.unavailable_reason()


@pytest.mark.skipif(NO_SLURM is not None, reason=f"no SLURM cluster here: {NO_SLURM}")
@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(300)
@pytest.mark.parametrize("as_root", [True, False], ids=["as root", "as a user"])
def test_a_slurm_array_grades_slices_of_the_class_and_a_lost_task_is_not_graded(tmp_path,
                                                                                as_root):
    """As a user: the grader takes its unprivileged path (COURSE_SANDBOX_NO_ROOT=1, as where
    SLURM runs jobs under the instructor's own account) and isolates with user namespaces."""
    klass, out, out_csv = tmp_path / "class", tmp_path / "runs", tmp_path / "class.csv"
    for student, source in (("ann", "solutions"), ("ben", "lessons"), ("cat", "solutions"),
                            ("dan", "solutions")):
        (klass / student / "lesson1").mkdir(parents=True)
        shutil.copy(ROOT / source / "lesson1" / "exercises.py", klass / student / "lesson1")
    # 3 tasks: ann and dan in task 0, ben (the stubs) in task 1, cat in task 2
    command = [PYTHON, "-m", "ddpcourse.course.grading", "class", str(klass), "--lesson", "1",
               "--slurm", "--tasks", "3", "--out", str(out), "--csv", str(out_csv)]
    cancelled = None
    with slurm.Cluster(1) as cluster:  # submitted from host 0, as from a login node
        env = dict(cluster.env(), **({} if as_root else {"COURSE_SANDBOX_NO_ROOT": "1"}))
        grader = subprocess.Popen(cluster.hosts.command(0, command), env=env,
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        while grader.poll() is None and cancelled is None:  # task 1 lost, as to a dead node
            queued = cluster.run(["squeue", "--noheader", "--array", "--format=%i"]).stdout
            job = re.search(r"^(\d+)_", queued, re.M)
            if job:
                shown = cluster.run(["scontrol", "show", "job", job.group(1)]).stdout
                cancelled = cluster.run(["scancel", f"{job.group(1)}_1"]).returncode
            time.sleep(0.1)
        said, _ = grader.communicate(timeout=240)
    assert grader.returncode == 0 and cancelled == 0, said[-3000:]
    # the memory the batch file asks for is what SLURM holds for each task
    asked = re.search(r"^#SBATCH --mem=(\S+)", (ROOT / "tests/grading/grade_class.sbatch")
                      .read_text(), re.M).group(1)
    assert re.search(rf"\bMinMemoryNode={asked}\b", shown), shown
    # sbatch --wait may say 0 for a task cancelled before it started: the merge goes by the
    # results each task wrote, not by that status
    assert re.search(r"SLURM array of 3 task\(s\) ended with exit status \d+", said), said
    rows = {row["student"]: row for row in csv.DictReader(out_csv.open())}
    assert list(rows) == ["ann", "ben", "cat", "dan"], rows
    # ben's task never ran: not graded, with where to look; never a silent 0
    assert rows["ben"]["total"] == "" and rows["ben"]["l1_identity"] == ""
    assert rows["ben"]["status"].startswith(
        "not graded: lesson 1: SLURM array task 1 ended without results"), rows["ben"]
    saved = json.loads(out_csv.with_suffix(".json").read_text())["students"]
    assert saved["ben"]["total"] is None and saved["ben"]["scores"] == {}
    # the others, graded by tasks 0 and 2 as a local run grades them: full marks
    for student in ("ann", "cat", "dan"):
        scores = json.loads((out / student / "lesson1" / "results.json").read_text())["scores"]
        assert rows[student]["status"] == "graded"
        assert {e: float(rows[student][e]) for e in scores} == {
            e: s["possible"] for e, s in scores.items()}, (student, scores)
        assert float(rows[student]["total"]) == saved[student]["total"] == sum(
            s["possible"] for s in scores.values()) > 0
        assert (out / student / "lesson1" / "junit.xml").exists()
    # each task grades as many students at once as it has CPUs, whatever the login node has
    for task in (0, 2):
        said_by_task = (out / "slurm" / f"task-{task}.out").read_text()
        assert re.search(r"^grading \d+ submission\(s\), 2 at once$", said_by_task, re.M), \
            said_by_task[-2000:]
        isolated = "isolation: full (root)" if as_root else "isolation: user namespaces"
        assert isolated in said_by_task, said_by_task[-2000:]
