"""A student who attacks the grader gets exactly the score their honest work earns.

Each file in cheats/ is lesson 1's stubs plus one way around the grader, one file per class of
hole (tests/grading/README.md, "What a submission cannot do"); its docstring says the score
its honest part is worth. The class is graded as an instructor grades one (`grading class`,
each student alone in a sandbox), beside an unfinished submission and a finished one whose
names sort before and after every cheat. Then: every cheat scores exactly its honest score,
the two honest students score what they would alone, nothing of any submission still runs,
and not a byte of the course or of another submission changed.

Full isolation needs root (an unprivileged user of its own, namespaces and a file system of
its own): CI and Gradescope run as root; elsewhere this test skips, saying so.

The grader's probes run beside the submission, where it may have replaced torch.equal: a
lesson 6 submission that does must score what its honest part earns too (no root needed).
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from util import PYTHON, ROOT, grade_class_of, run

from ddpcourse.course.grading import summarise
from ddpcourse.course.sandbox import FIRST_UID, UID_SLOTS, is_root

CHEATS = Path(__file__).parent / "cheats"
HONEST = re.compile(r"Honest score: (\d+)\.")
FULL_MARKS = 20  # lesson 1

pytestmark = pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                                reason="this copy of the course has no solutions/")
needs_root = pytest.mark.skipif(not is_root(), reason="the grading sandbox isolates students "
                                "only when the grader runs as root with util-linux's unshare "
                                "(as CI and Gradescope do)")


def digest(paths) -> str:
    """One hash of the files under `paths` (names and bytes), caches left out."""
    h = hashlib.sha256()
    for base in paths:
        for path in sorted(Path(base).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def course_files():
    return [ROOT / part for part in ("ddpcourse", "tests/grading", "lessons", "solutions")]


def daemons(marker: bytes = b"course-cheat-daemon", patience: float = 5.0) -> list[str]:
    """Processes a cheat started (their command line carries `marker`) still alive (zombies,
    already ended, left out) after `patience` seconds. Not "every process of a sandbox user":
    other tests grade at the same time, under the same user ids."""
    deadline = time.monotonic() + patience
    while True:
        found = running_leftovers(marker)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def running_leftovers(marker: bytes) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z":
            continue
        if marker in cmdline:
            found.append(f"{entry}: {cmdline[:120].decode(errors='replace')}")
    return found


@needs_root
@pytest.mark.slow
@pytest.mark.grading_heavy  # a class of 11 graded alone, about 2 minutes: make test-grading
@pytest.mark.timeout(600)
def test_every_cheat_scores_its_honest_score_and_touches_no_one(tmp_path):
    stubs = (ROOT / "lessons" / "lesson1" / "exercises.py").read_text()
    klass = tmp_path / "class"
    honest = {"aaa_stub": 0, "zzz_solution": FULL_MARKS}
    for name, source in (("aaa_stub", stubs),
                         ("zzz_solution", (ROOT / "solutions" / "lesson1" /
                                           "exercises.py").read_text())):
        (klass / name / "lesson1").mkdir(parents=True)
        (klass / name / "lesson1" / "exercises.py").write_text(source)
    for cheat in sorted(CHEATS.glob("*.py")):
        text = cheat.read_text()
        honest[cheat.stem] = int(HONEST.search(text).group(1))
        (klass / cheat.stem / "lesson1").mkdir(parents=True)
        (klass / cheat.stem / "lesson1" / "exercises.py").write_text(
            stubs + "\n\n# --- the cheat\n" + text)
    assert len(honest) >= 9, "a cheat for every class of hole"
    course_before = digest(course_files())
    class_before = {p.name: digest([p]) for p in klass.iterdir()}
    students = grade_class_of(1, klass, tmp_path / "grades", timeout=540)
    wrong = {name: (row["total"], row["status"]) for name, row in students.items()
             if row["total"] != honest[name] or row["status"] != "graded"}
    assert not wrong, f"scores (total, status) other than the honest ones {honest}: {wrong}"
    assert not daemons(), "still running after grading: " + "; ".join(daemons())
    assert digest(course_files()) == course_before, "a course file changed"
    assert {p.name: digest([p]) for p in klass.iterdir()} == class_before, \
        "a submission folder changed"


RELAYED = {4: (CHEATS / "lesson4", 42), 10: (CHEATS / "lesson10", 28)}  # lesson: (cheats, full)


@pytest.mark.slow
@pytest.mark.grading_heavy
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lesson", sorted(RELAYED))
@pytest.mark.parametrize("root", [pytest.param(True, marks=needs_root), False],
                         ids=["as root", "without root"])
def test_what_a_rank_does_beside_the_relay_buys_nothing(tmp_path, root, lesson):
    """Class 9: the mechanism seen from outside (ddpcourse/course/relay.py). Each cheat is
    the lesson's reference with one exercise replaced: numbers passed between its own ranks
    through what a machine shares beside decoy messages of the right peers and sizes, inputs
    predicted instead of received, a ready-made collective by every road. Each scores its
    honest score (what its exercise earns without the cheat's help), the reference full
    marks: as root (every rank a sandbox of its own) and without (every rank in namespaces
    of its own inside a user namespace)."""
    cheats, full = RELAYED[lesson]
    reference = (ROOT / "solutions" / f"lesson{lesson}" / "exercises.py").read_text()
    klass = tmp_path / "class"
    honest = {"zzz_solution": full}
    (klass / "zzz_solution" / f"lesson{lesson}").mkdir(parents=True)
    (klass / "zzz_solution" / f"lesson{lesson}" / "exercises.py").write_text(reference)
    for cheat in sorted(cheats.glob("*.py")):
        text = cheat.read_text()
        honest[cheat.stem] = int(HONEST.search(text).group(1))
        (klass / cheat.stem / f"lesson{lesson}").mkdir(parents=True)
        (klass / cheat.stem / f"lesson{lesson}" / "exercises.py").write_text(
            reference + "\n\n# --- the cheat\n" + text)
    students = grade_class_of(lesson, klass, tmp_path / "grades", timeout=540,
                              env=None if root else {"COURSE_SANDBOX_NO_ROOT": "1"})
    wrong = {name: (row["total"], row["status"]) for name, row in students.items()
             if row["total"] != honest[name] or row["status"] != "graded"}
    assert not wrong, f"scores (total, status) other than the honest ones {honest}: {wrong}"
    assert not daemons(b"course-cheat"), "still running after grading: " + "; ".join(daemons())


@needs_root
def test_every_cheat_says_its_class_and_honest_score():
    cheats = [*CHEATS.glob("*.py"), *(p for folder, _ in RELAYED.values()
                                      for p in folder.glob("*.py"))]
    for cheat in sorted(cheats):
        text = cheat.read_text()
        assert re.match(r'"""class \d, ', text) and HONEST.search(text), cheat.name
    classes = {int(re.match(r'"""class (\d)', p.read_text()).group(1)) for p in cheats}
    # Class 7 (files that are not the student's own) is folder shapes, not code: test_intake.py.
    assert classes == {1, 2, 3, 4, 5, 6, 8, 9}


@needs_root
def test_a_child_cannot_see_the_checkout_write_the_record_or_reach_the_network(tmp_path):
    """The sandbox itself, probed from inside with a submission that reports what it can do."""
    if not is_root():
        pytest.skip("needs root")
    submission = tmp_path / "probe" / "lesson1"
    submission.mkdir(parents=True)
    (submission / "exercises.py").write_text('''
import os, socket, subprocess, sys

def global_rank(path, *more):
    if path == "uid":
        return os.getuid()
    if path == "daemon":
        subprocess.Popen([sys.executable, "-c", "import time  # " + more[0] + "\\ntime.sleep(600)"],
                         start_new_session=True)
        return "started"
    if path == "connect":
        try:
            socket.create_connection(("1.1.1.1", 53), timeout=2)
            return "connected"
        except OSError as error:
            return type(error).__name__
    if path == "listdir":
        try:
            return sorted(os.listdir(more[0]))
        except OSError as error:
            return type(error).__name__
    try:
        with open(path, "a") as f:
            f.write("x")
        return "wrote"
    except OSError as error:
        return type(error).__name__
''')
    marker = f"course-probe-daemon-{os.getpid()}-{tmp_path.name}"
    script = f'''
import json, os
os.environ["COURSE_SUBMISSION"] = {str(tmp_path / "probe")!r}
from ddpcourse.course.sandbox import Submission
ex = Submission(1)
print(json.dumps({{
    "uid": ex.global_rank("uid"),
    "solutions": ex.global_rank("listdir", {str(ROOT / "solutions")!r}),
    "class": ex.global_rank("listdir", {str(tmp_path)!r}),
    "grader": ex.global_rank({str(ROOT / "tests" / "grading" / "jobs.py")!r}),
    "net": ex.global_rank("connect"),
    "daemon": ex.global_rank("daemon", {marker!r}),
}}))
ex.close()
'''
    result = subprocess.run([shutil.which("python3") if not (ROOT / ".venv").exists()
                             else str(ROOT / ".venv" / "bin" / "python"), "-c", script],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert FIRST_UID <= seen["uid"] < FIRST_UID + UID_SLOTS, seen
    # Its file system holds none of it: not the checkout, not the other students
    assert seen["solutions"] == "FileNotFoundError", seen
    assert seen["class"] == "FileNotFoundError", seen
    assert seen["grader"] == "FileNotFoundError", seen
    assert seen["net"] in ("OSError", "TimeoutError", "ConnectionRefusedError"), seen
    assert seen["daemon"] == "started", seen
    assert not daemons(marker.encode()), "what the sandbox started still runs"


# --- a verdict forged beside the grader's probe ---------------------------------------------

# The grader's probes (ddpcourse/course/probes.py) run in the submission's process, where the
# submission may have replaced any function: a probe that compared there would report the
# submission's answer. The mistake reseeds torch's global generator, which lesson 6's
# GENERATOR_TEST checks through the probe global_generator_after.
GENERATOR_EXERCISE = "l6_resume_position"
GENERATOR_TEST = "test_torchs_global_generator_is_left_alone"
GENERATOR_MISTAKE = ROOT / "tests" / "project" / "wrong_submissions" / "lesson6" / \
    "position_seeds_the_global_generator.py"
EVERY_TENSOR_EQUAL = "\n\n# --- the cheat\ntorch.equal = lambda *a, **k: True\n"


def grade_lesson6_exercise(folder: Path, results: Path) -> dict[str, dict]:
    """GENERATOR_EXERCISE's grading tests of one submission folder: test name -> its result."""
    report = run([PYTHON, "-m", "pytest", "tests/grading/test_lesson6.py", "-q", "--tb=line",
                  "-p", "no:cacheprovider", "-m", GENERATOR_EXERCISE],
                 env={"COURSE_SUBMISSION": str(folder), "COURSE_RESULTS": str(results)},
                 timeout=240)
    assert results.exists(), report.stdout[-3000:] + report.stderr[-2000:]
    tests = json.loads(results.read_text())["tests"]
    assert tests, report.stdout[-3000:]
    return {nodeid.rsplit("::", 1)[-1]: test for nodeid, test in tests.items()}


@pytest.mark.slow
@pytest.mark.grading_heavy
@pytest.mark.timeout(540)
def test_a_submission_that_replaces_torch_equal_scores_its_honest_score(tmp_path):
    """The reference solution with GENERATOR_MISTAKE, once as it is and once with torch.equal
    replaced at import to say every two tensors are equal: both lose GENERATOR_TEST's points,
    and the exercise scores the same."""
    mistaken = (ROOT / "solutions" / "lesson6" / "exercises.py").read_text() + \
        f"\n\n# --- from {GENERATOR_MISTAKE.name}\n" + GENERATOR_MISTAKE.read_text()
    graded = {}
    for name, source in (("honest", mistaken), ("forged", mistaken + EVERY_TENSOR_EQUAL)):
        (tmp_path / name / "lesson6").mkdir(parents=True)
        (tmp_path / name / "lesson6" / "exercises.py").write_text(source)
        graded[name] = grade_lesson6_exercise(tmp_path / name, tmp_path / f"{name}.json")
    honest, forged = graded["honest"], graded["forged"]
    assert honest[GENERATOR_TEST]["outcome"] == "failed", \
        f"{GENERATOR_MISTAKE.name} reseeds the global generator: {honest[GENERATOR_TEST]}"
    assert forged[GENERATOR_TEST]["outcome"] == honest[GENERATOR_TEST]["outcome"], \
        "with torch.equal replaced the generator's test passed: a probe compared tensors"
    assert summarise(forged) == summarise(honest), (forged, honest)
