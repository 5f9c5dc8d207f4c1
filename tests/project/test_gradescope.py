"""Gradescope's autograder (`make gradescope LESSON=1`) grades as the course's grader does.

The zip is unpacked into a folder laid out as Gradescope's /autograder (source/, submission/,
results/) and its run_autograder is run there, as Gradescope runs it for each submission.
Instead of setup.sh (which makes a .venv: minutes, and downloads), run_autograder is pointed at
this session's interpreter (COURSE_PYTHON) and at the folder (AUTOGRADER_ROOT).
"""

import json
import re
import shutil
import stat
import zipfile

import pytest
from util import PYTHON, ROOT, run

from ddpcourse.course.gradescope import SubmissionError, staged_submission
from ddpcourse.course.grading import summarise

pytestmark = pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                                reason="this copy of the course has no solutions/")

LESSON = 1  # its grading takes about 4 s here: one job of 2 x 2 processes
SOLUTION = ROOT / "solutions" / f"lesson{LESSON}" / "exercises.py"
STUB = ROOT / "lessons" / f"lesson{LESSON}" / "exercises.py"
MISTAKE = ROOT / "tests" / "project" / "wrong_submissions" / "lesson1" / "node_groups_strided.py"
HEADER = re.compile(r'^"""(l\d+_\w+): (\d+) of (\d+)\.')


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gradescope")
    made = run(["make", "--no-print-directory", "gradescope", f"LESSON={LESSON}",
                f"GRADESCOPE={folder}"], timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    return folder / f"autograder-lesson{LESSON}.zip"


@pytest.fixture(scope="module")
def lesson_points(tmp_path_factory):
    """test name -> points, from pytest's collection of the lesson's grading tests."""
    results = tmp_path_factory.mktemp("collect") / "results.json"
    collected = run([PYTHON, "-m", "pytest", f"tests/grading/test_lesson{LESSON}.py",
                     "--collect-only", "-q", "-p", "no:cacheprovider"],
                    env={"COURSE_RESULTS": str(results)}, timeout=120)
    assert collected.returncode == 0, collected.stdout[-3000:]
    tests = json.loads(results.read_text())["tests"]
    return {f"{t['exercise']}: {nodeid.split('::', 1)[1]}": t["points"]
            for nodeid, t in tests.items()}


def unpacked(autograder_zip, root):
    """root laid out as Gradescope's /autograder, the zip in source/ with its file modes."""
    source = root / "source"
    with zipfile.ZipFile(autograder_zip) as archive:
        archive.extractall(source)
        for entry in archive.infolist():
            mode = entry.external_attr >> 16
            if mode:
                (source / entry.filename).chmod(stat.S_IMODE(mode))
    (root / "submission").mkdir()
    (root / "results").mkdir()
    shutil.copy2(source / "run_autograder", root / "run_autograder")  # as Gradescope does
    return root


def run_autograder(root):
    """Gradescope's run for one submission: run_autograder from the root, then results.json."""
    # No job cache: installing it imports this checkout's ddpcourse before the zip's own.
    done = run([str(root / "run_autograder")], cwd=root, timeout=200,
               env={"AUTOGRADER_ROOT": str(root), "COURSE_PYTHON": PYTHON,
                    "COURSE_JOB_CACHE": ""})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads((root / "results" / "results.json").read_text())


def test_the_zip_holds_what_gradescope_runs_and_no_answers(autograder_zip):
    with zipfile.ZipFile(autograder_zip) as archive:
        entries = {entry.filename: entry for entry in archive.infolist()}
        run_script = archive.read("run_autograder").decode()
        setup = archive.read("setup.sh").decode()
    for script in ("setup.sh", "run_autograder"):  # at the root, executable
        assert stat.S_IMODE(entries[script].external_attr >> 16) & 0o111, script
    assert "make setup" in setup
    assert f"--lesson '{LESSON}'" in run_script
    assert "tests/grading/conftest.py" in entries and "ddpcourse/course/grading.py" in entries
    assert not [name for name in entries if name.startswith(
        ("solutions/", "tests/project/wrong_submissions/"))]


def test_an_upload_without_exercises_is_told_what_to_upload(autograder_zip, tmp_path):
    root = unpacked(autograder_zip, tmp_path)
    (root / "submission" / "notes.txt").write_text("my answers are in my head\n")
    results = run_autograder(root)
    assert results["score"] == 0
    assert "exercises.py" in results["output"] and "notes.txt" in results["output"]


LAYOUTS = {  # what a student uploads -> the file graded as lesson 1's, as they named it
    "exercises.py": ("lesson1/exercises.py", "exercises.py"),
    "lesson1/exercises.py": ("lesson1/exercises.py", "lesson1/exercises.py"),
    "lessons/lesson1/exercises.py": ("lessons/lesson1/exercises.py",
                                     "lessons/lesson1/exercises.py"),
    "my-work/lesson1/exercises.py": ("lesson1/exercises.py", "lesson1/exercises.py"),
    "my-work/exercises.py": ("lesson1/exercises.py", "exercises.py"),
}


@pytest.mark.parametrize("upload", LAYOUTS)
def test_every_way_students_upload_is_graded_as_the_lesson(tmp_path, upload):
    submission, stage = tmp_path / "submission", tmp_path / "stage"
    (submission / upload).parent.mkdir(parents=True)
    (submission / upload).write_text("# alice's answers\n")
    graded, named_from = staged_submission(submission, 1, stage)
    graded_file, shown_as = LAYOUTS[upload]
    assert (graded / graded_file).read_text() == "# alice's answers\n"
    assert (graded / graded_file).relative_to(named_from).as_posix() == shown_as


@pytest.mark.parametrize("upload, lesson", [("lesson3/exercises.py", 1),  # another lesson's
                                            ("exercises.py", None),       # which lesson?
                                            ("answers.txt", 1)])
def test_an_upload_the_grader_cannot_place_is_refused(tmp_path, upload, lesson):
    (tmp_path / "submission" / upload).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "submission" / upload).write_text("")
    with pytest.raises(SubmissionError):
        staged_submission(tmp_path / "submission", lesson, tmp_path / "stage")


def with_mistake():
    """The reference with one wrong function pasted over it, and what its header says it
    costs: (source, exercise, points earned, points possible)."""
    exercise, earned, possible = HEADER.match(MISTAKE.read_text()).groups()
    source = SOLUTION.read_text() + f"\n\n# --- from {MISTAKE.name}\n" + MISTAKE.read_text()
    return source, exercise, float(earned), float(possible)


# Students upload their exercises.py alone, lessonN/ folders, or their copy of the course.
UPLOADS = {"reference as a copy of the course": f"lessons/lesson{LESSON}/exercises.py",
           "stubs in a lesson folder": f"lesson{LESSON}/exercises.py",
           "one mistake as exercises.py alone": "exercises.py"}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", UPLOADS)
def test_a_submission_scores_what_the_grader_gives(autograder_zip, lesson_points, tmp_path, case):
    root = unpacked(autograder_zip, tmp_path)
    upload = root / "submission" / UPLOADS[case]
    upload.parent.mkdir(parents=True, exist_ok=True)
    source, exercise, earned, possible = with_mistake()
    upload.write_text({"reference as a copy of the course": SOLUTION.read_text(),
                       "stubs in a lesson folder": STUB.read_text(),
                       "one mistake as exercises.py alone": source}[case])
    results = run_autograder(root)
    # What a test that drew hidden cases said comes after the due date, in an entry of its own
    said_later = {t["name"].removesuffix(", what it said"): t for t in results["tests"]
                  if t.get("visibility") == "after_due_date"}
    tests = {t["name"]: t for t in results["tests"] if "visibility" not in t}
    # One entry per grading test of the lesson, each worth what the grader says.
    assert {name: t["max_score"] for name, t in tests.items()} == lesson_points
    assert results["score"] == sum(t["score"] for t in tests.values())
    for t in tests.values():
        assert t["score"] in (0, t["max_score"]) and t["output"]
        assert (t["status"] == "passed") == (t["score"] == t["max_score"]), t
    for name, later in said_later.items():
        assert later["max_score"] == later["score"] == 0 and tests[name]["status"] == "failed"
        assert "drawn at grading time" in tests[name]["output"], tests[name]
        tests[name] = {**tests[name], "output": later["output"]}  # what the student sees later
    total = sum(lesson_points.values())
    # The zip's own grader graded it: its results are in the unpacked course.
    grader = json.loads((root / "source" / "build" / "grades" / "gradescope" / "results.json")
                        .read_text())
    assert sum(s["earned"] for s in summarise(grader["tests"]).values()) == results["score"]
    if case.startswith("reference"):
        assert results["score"] == total > 0 and not said_later
    elif case.startswith("stubs"):
        assert results["score"] == 0
        # what the student reads: the grading line that failed and the error under it
        for t in tests.values():
            assert f"tests/grading/test_lesson{LESSON}.py:" in t["output"], t
            assert re.search(r"^E\s+\S", t["output"], re.M), t
        assert any("NotImplementedError" in t["output"] for t in tests.values())
        # lesson 1's tests that draw hidden cases: each message held back until the due date
        assert said_later, "no test that drew hidden cases held its message back"
    else:
        assert results["score"] == total - (possible - earned), "\n".join(
            f"{name}: {t['status']}\n{t['output'][-1500:]}" for name, t in tests.items()
            if t["status"] != "passed")
        mistaken = [t for name, t in tests.items() if name.startswith(f"{exercise}: ")]
        assert sum(t["score"] for t in mistaken) == earned
        failed = [t for t in mistaken if t["status"] == "failed"]
        # what the student reads: the grading check that failed and its assertion
        assert failed and all("assert" in t["output"] and "Use -v" not in t["output"]
                              for t in failed)
        assert re.search(rf"^{exercise}\s+{earned:g} / {possible:g}$", results["output"], re.M)


def test_the_zip_holds_one_seed_for_every_submission(autograder_zip):
    """The hidden cases' seed is in run_autograder (the instructor's zip), never in a file a
    student gets; a seed given as COURSE_HIDDEN_SEED is the one written."""
    with zipfile.ZipFile(autograder_zip) as archive:
        script = archive.read("run_autograder").decode()
    assert re.search(r"^export COURSE_HIDDEN_SEED='[0-9A-Za-z_-]{1,64}'$", script, re.M), script
    release = autograder_zip.parent / "source"
    made = run([PYTHON, "-m", "ddpcourse.course.gradescope", "build", str(release), "--zip",
                str(autograder_zip.parent / "again.zip"), "--lesson", str(LESSON)],
               env={"COURSE_HIDDEN_SEED": "term-2027-a"}, timeout=60)
    assert made.returncode == 0 and "seed term-2027-a" in made.stdout, made.stdout + made.stderr
    with zipfile.ZipFile(autograder_zip.parent / "again.zip") as archive:
        assert "export COURSE_HIDDEN_SEED='term-2027-a'" in archive.read("run_autograder").decode()
    refused = run([PYTHON, "-m", "ddpcourse.course.gradescope", "build", str(release), "--zip",
                   str(autograder_zip.parent / "bad.zip")], env={"COURSE_HIDDEN_SEED": "a'; rm"},
                  timeout=60)
    assert refused.returncode != 0 and refused.stderr.strip().count("\n") == 0, refused.stderr


@pytest.mark.parametrize("created, due, said", [
    ("2027-03-01T10:00:00-05:00", "2027-03-01T23:59:00-05:00", ""),
    ("2027-03-02T05:59:00-05:00", "2027-03-01T23:59:00-05:00", "Submitted 6.0 hours after"),
    ("2027-03-04T11:59:00+00:00", "2027-03-01T23:59:00-05:00", "Submitted 2.3 days after"),
    (None, None, ""),  # no metadata: nothing said
])
def test_a_late_submission_is_told_it_is_late(tmp_path, created, due, said):
    from ddpcourse.course.gradescope import lateness

    metadata = tmp_path / "submission_metadata.json"
    if created:
        metadata.write_text(json.dumps({"created_at": created,
                                        "assignment": {"due_date": due}}))
    got = lateness(metadata)
    assert got.startswith(said) if said else got == "", got
