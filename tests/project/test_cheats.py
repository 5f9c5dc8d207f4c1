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
from util import PYTHON, ROOT, run

from ddpcourse.course.sandbox import FIRST_UID, UID_SLOTS, is_root

CHEATS = Path(__file__).parent / "cheats"
HONEST = re.compile(r"Honest score: (\d+)\.")
FULL_MARKS = 20  # lesson 1

pytestmark = [
    pytest.mark.skipif(not is_root(), reason="the grading sandbox isolates students only when "
                       "the grader runs as root with util-linux's unshare (as CI and "
                       "Gradescope do)"),
    pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                       reason="this copy of the course has no solutions/"),
]


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


@pytest.mark.slow
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
    out = tmp_path / "grades"

    graded = run([PYTHON, "-m", "ddpcourse.course.grading", "class", str(klass), "--lesson", "1",
                  "--csv", str(out / "class.csv"), "--out", str(out / "class"),
                  "--workers", "2"], timeout=540)
    assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
    students = json.loads((out / "class.json").read_text())["students"]
    wrong = {name: (row["total"], row["status"]) for name, row in students.items()
             if row["total"] != honest[name] or row["status"] != "graded"}
    assert not wrong, (f"scores (total, status) other than the honest ones {honest}: {wrong}\n"
                       + graded.stdout[-3000:])
    assert not daemons(), "still running after grading: " + "; ".join(daemons())
    assert digest(course_files()) == course_before, "a course file changed"
    assert {p.name: digest([p]) for p in klass.iterdir()} == class_before, \
        "a submission folder changed"


def test_every_cheat_says_its_class_and_honest_score():
    for cheat in sorted(CHEATS.glob("*.py")):
        text = cheat.read_text()
        assert re.match(r'"""class \d, ', text) and HONEST.search(text), cheat.name
    classes = {int(re.match(r'"""class (\d)', p.read_text()).group(1))
               for p in CHEATS.glob("*.py")}
    assert classes == {1, 2, 3, 4, 5, 6}


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
