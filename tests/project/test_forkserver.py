"""The fork server's stand-ins behave as the real interpreter does (ddpcourse/course/forkserver.py).

Every other test runs its processes through them, so these compare the two directly: what a
program sees (argv, environment, working folder, sys.path, stdin, pids), how it ends (exit
codes, exceptions, signals) and that a killed stand-in takes its worker with it.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from util import PYTHON, REAL_PYTHON, ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(PYTHON == REAL_PYTHON, reason="the fork server is off")]

PROBE = r"""
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
                  "extra": [p for p in sys.path if "extra_dir" in p],
                  "env": os.environ.get("PROBE"), "stdin": sys.stdin.read(),
                  "name": __name__}))
sys.stdout.flush()
how = os.environ.get("END", "")
if how == "code":
    sys.exit(7)
if how == "message":
    sys.exit("a message")
if how == "raise":
    raise ValueError("boom")
if how == "signal":
    os.kill(os.getpid(), 15)
"""


def both(args, tmp_path, **env):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    results = []
    for python in (PYTHON, REAL_PYTHON):
        results.append(subprocess.run(
            [python, *[str(script) if a == "SCRIPT" else a for a in args]], input="hello",
            capture_output=True, text=True, cwd=tmp_path, timeout=60,
            env=dict(os.environ, PROBE="x", PYTHONPATH=str(tmp_path / "extra_dir"), **env)))
    return results


@pytest.mark.parametrize("end", ["", "code", "message", "raise", "signal"])
def test_a_program_sees_and_ends_the_same(tmp_path, end):
    fork, real = both(["-u", "SCRIPT", "a", "b c"], tmp_path, END=end)
    assert fork.returncode == real.returncode
    assert json.loads(fork.stdout) == json.loads(real.stdout)
    assert fork.stderr.replace(PYTHON, REAL_PYTHON) == real.stderr


def test_module_and_code_run_as_main(tmp_path):
    fork, real = both(["-m", "json.tool"], tmp_path)
    assert fork.returncode == real.returncode == 1  # "hello" is not JSON: the same message
    assert fork.stderr == real.stderr
    fork, real = both(["-c", "import sys; print(sys.argv, __name__, sys.path[0] == '')", "x"],
                      tmp_path)
    assert fork.stdout == real.stdout == "['-c', 'x'] __main__ True\n"


def test_the_pid_a_program_sees_is_the_one_its_parent_knows_and_signals_reach_it(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text("import os, sys, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([PYTHON, str(script)], stdout=subprocess.PIPE, text=True)
    assert int(child.stdout.readline()) == child.pid
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_a_killed_stand_in_takes_its_worker_with_it(tmp_path):
    marker = tmp_path / "worker_pid"
    script = tmp_path / "wait.py"  # /proc/self: the worker's own pid, not the stand-in's
    script.write_text("import os, time\nfrom pathlib import Path\n"
                      f"Path({str(marker)!r}).write_text(os.readlink('/proc/self'))\n"
                      "time.sleep(60)\n")
    child = subprocess.Popen([PYTHON, str(script)], cwd=ROOT)
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    worker = int(marker.read_text())
    assert worker != child.pid and os.path.exists(f"/proc/{worker}")
    child.kill()
    assert child.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{worker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{worker}")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
