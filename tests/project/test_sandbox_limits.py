"""Everything a submission can allocate is bounded, counted and gone with its sandbox.

A submission reports, from inside its sandbox, how far it got: how much it could write to
/tmp, /dev/shm and its home (each a tmpfs of its own, bounded), how large a System V segment
it could make (its IPC namespace's limits), whether a segment it left behind is there for the
next sandbox (it is not: the namespace ends with it), and how many threads it could start
(its user's task limit). Memory held in a tmpfs counts toward the sandbox's memory limit.
Needs root, as the sandbox's isolation does.
"""

import json
import shutil
import subprocess

import pytest
from util import ROOT

from ddpcourse.course.sandbox import is_root
from ddpcourse.course.sandbox_child import HOME_BYTES, MAX_TASKS, SHM_BYTES, TMP_BYTES

pytestmark = [pytest.mark.slow, pytest.mark.grading_heavy, pytest.mark.skipif(
    not is_root(), reason="the sandbox isolates and bounds a submission only when the grader "
    "runs as root with util-linux's unshare (as CI and Gradescope do)")]

REPORTER = '''
import ctypes, os, threading

libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT, IPC_PRIVATE = 0o1000, 0


def fill(folder, most=3 << 30):
    path, written = os.path.join(folder, "filler"), 0
    chunk = b"\\1" * (4 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while written < most:
            written += os.write(fd, chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
    return written


def global_rank(what, arg=0):
    if what == "fill":
        written = fill(os.path.expandvars(arg))
        os.remove(os.path.join(os.path.expandvars(arg), "filler"))
        return written
    if what == "hold":  # and keep it: the judge looks once a second
        written = fill(os.path.expandvars(arg), most=900 << 20)
        __import__("time").sleep(30)
        return written
    if what == "segment":
        return libc.shmget(IPC_PRIVATE, ctypes.c_size_t(arg), IPC_CREAT | 0o600)
    if what == "leave segment":
        return libc.shmget(arg, ctypes.c_size_t(4096), IPC_CREAT | 0o666)
    if what == "find segment":
        return libc.shmget(arg, ctypes.c_size_t(0), 0)
    if what == "threads":
        release, started = threading.Event(), 0
        try:
            while started < 3 * arg:
                threading.Thread(target=release.wait, daemon=True).start()
                started += 1
        except RuntimeError:
            pass
        release.set()
        return started
'''

SCRIPT = '''
import json, os
os.environ["COURSE_SUBMISSION"] = {folder!r}
from ddpcourse.course.sandbox import Submission, SubmissionError
ex = Submission(1)
seen = {{"tmp": ex.global_rank("fill", "/tmp"), "shm": ex.global_rank("fill", "/dev/shm"),
        "home": ex.global_rank("fill", "$HOME"),
        "big segment": ex.global_rank("segment", 1 << 30),
        "small segment": ex.global_rank("segment", 1 << 20),
        "left": ex.global_rank("leave segment", 0x5EED),
        "threads": ex.global_rank("threads", {tasks})}}
ex.close()
again = Submission(1)
seen["found by the next"] = again.global_rank("find segment", 0x5EED)
again.close()
print(json.dumps(seen))
'''

HOLD = '''
import json, os
os.environ["COURSE_SUBMISSION"] = {folder!r}
from ddpcourse.course.sandbox import Submission, SubmissionError
ex = Submission(1)
try:
    print(json.dumps({{"held": ex.global_rank("hold", "$HOME")}}))
except SubmissionError as error:
    print(json.dumps({{"ended": str(error)}}))
ex.close()
'''


def reporter(tmp_path):
    (tmp_path / "reporter" / "lesson1").mkdir(parents=True)
    (tmp_path / "reporter" / "lesson1" / "exercises.py").write_text(REPORTER)
    return str(tmp_path / "reporter")


def course_python():
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else shutil.which("python3")


@pytest.mark.timeout(300)
def test_what_a_sandbox_can_hold_outside_its_processes_is_bounded(tmp_path):
    result = subprocess.run([course_python(), "-c", SCRIPT.format(
        folder=reporter(tmp_path), tasks=MAX_TASKS)], cwd=ROOT, capture_output=True, text=True,
        timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    for place, bound in (("tmp", TMP_BYTES), ("shm", SHM_BYTES), ("home", HOME_BYTES)):
        assert 0 < seen[place] <= bound, (place, seen)
    assert seen["big segment"] == -1, seen     # over the namespace's shmmax
    assert seen["small segment"] >= 0, seen    # System V itself still works
    assert seen["left"] >= 0, seen
    assert seen["found by the next"] == -1, "a segment outlived its sandbox"
    assert 0 < seen["threads"] < MAX_TASKS, seen


@pytest.mark.timeout(300)
def test_memory_held_in_a_tmpfs_counts_toward_the_limit(tmp_path):
    result = subprocess.run([course_python(), "-c", HOLD.format(folder=reporter(tmp_path))],
                            cwd=ROOT, capture_output=True, text=True, timeout=280,
                            env={"PATH": "/usr/bin:/bin", "COURSE_SANDBOX_MEMORY_GB": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert "ended" in seen and "memory" in seen["ended"], seen
