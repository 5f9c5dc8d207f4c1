"""The lesson runner behind every `make lessonN` target, and one run per job in a test session."""

import os
import time

import pytest
from util import PYTHON, ROOT, run

from ddpcourse.cluster.jobcache import JOB_CACHE, shared_job_cache
from ddpcourse.cluster.launch import launch
from ddpcourse.course.lessons import Step, Target, run_target, shown


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def test_steps_run_in_order_drills_may_fail_and_other_failures_stop(tmp_path, capfd):
    ok = script(tmp_path, "ok.py", "import sys; print('ran', sys.argv[1:])")
    drill = script(tmp_path, "drill.py", "raise SystemExit(1)")
    broken = script(tmp_path, "broken.py", "raise SystemExit(3)")
    target = Target("t", "help", [Step("python", [drill], drill="(that was the drill)"),
                                  Step("python", [ok, "--n", "{world}"]),
                                  Step("python", [broken]),
                                  Step("python", [ok, "never"])])
    rc = run_target(target, nproc="3", nnodes="2", port="", timeout="30", backend="gloo",
                    extra=["--epochs", "1"])
    out = capfd.readouterr().out
    assert rc == 3  # the broken step's own status, and the step after it never ran
    assert "(that was the drill)" in out
    assert "ran ['--n', '6', '--epochs', '1']" in out  # {world} = NPROC x NNODES, then ARGS
    assert "never" not in out
    assert out.count("$ CUDA_VISIBLE_DEVICES= ") == 3  # each step echoed as it runs


def test_a_target_refuses_fewer_processes_than_it_needs_and_echoes_paths_as_typed(
        tmp_path, capfd, monkeypatch):
    ok = script(tmp_path, "ok.py", "print('ran')")
    target = Target("needs-two", "a stuck rank and one waiting", [Step("python", [ok])],
                    min_world=2)
    assert run_target(target, nproc="1", nnodes="1", port="", timeout="30", backend="gloo",
                      extra=[]) == 2
    captured = capfd.readouterr()
    assert "ran" not in captured.out  # refused before any step
    assert captured.err == ("error: make needs-two needs NPROC x NNODES of at least 2 (here 1): "
                            "a stuck rank and one waiting\n")
    assert run_target(target, nproc="1", nnodes="2", port="", timeout="30", backend="gloo",
                      extra=[]) == 0
    # The interpreter is echoed relative to the course folder inside it, whole outside it.
    monkeypatch.chdir(tmp_path)
    assert shown(str(tmp_path / "venv" / "bin" / "python")) == "venv/bin/python"
    assert shown("/opt/python/bin/python3") == "/opt/python/bin/python3"


def test_unknown_target_and_bad_args_are_one_line_errors():
    result = run([PYTHON, "-m", "ddpcourse.course.lessons", "run", "lesson99"], timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: no lesson registers a target 'lesson99'"
    result = run([PYTHON, "-m", "ddpcourse.course.lessons", "run", "lesson1", "--args", "'open"],
                 timeout=30)
    assert result.returncode == 2 and result.stderr.startswith("error: ARGS=")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_lesson_job_runs_once_per_test_session(tmp_path, monkeypatch):
    monkeypatch.setenv(JOB_CACHE, str(tmp_path))
    first = launch("scripts/lesson1_whoami.py", nproc=1, timeout=60, capture=True, echo=False)
    assert first.returncode == 0, first.stderr[-2000:]
    started = time.monotonic()
    again = launch("scripts/lesson1_whoami.py", nproc=1, timeout=60, capture=True, echo=False)
    assert time.monotonic() - started < 1
    assert (again.returncode, again.stdout) == (first.returncode, first.stdout)
    # Another shape or another setting is another job: it runs (its pids differ).
    other = launch("scripts/lesson1_whoami.py", nproc=1, timeout=60, capture=True, echo=False,
                   env=dict(os.environ, TORCH_DISTRIBUTED_DEBUG="INFO"))
    assert other.returncode == 0 and other.stdout != first.stdout
    # Grading workers always run: their result depends on the submission being graded.
    worker = ROOT / "ddpcourse" / "course" / "workers" / "lesson3_ddp.py"
    assert shared_job_cache(str(worker), [], 2, 1, "", dict(os.environ), None, True) is None
    assert shared_job_cache("scripts/lesson1_whoami.py", [], 2, 1, "", dict(os.environ),
                            None, capture=False) is None
