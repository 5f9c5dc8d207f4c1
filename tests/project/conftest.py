"""The course's own tests share each job and start their Python processes from a fork server.

COURSE_JOB_CACHE: a lesson script's job with the same arguments runs once per session (see
ddpcourse/cluster/jobcache.py). COURSE_FORKSERVER: a folder with stand-ins for `python` and
`torchrun` whose processes are forks of a server that has imported torch (see
ddpcourse/course/forkserver.py).
Set COURSE_FORKSERVER_OFF=1 to run every process with the real interpreter.
"""

import os
import shutil
import sys
import tempfile
import time

import pytest

from ddpcourse.cluster import jobcache
from ddpcourse.cluster.jobcache import JOB_CACHE
from ddpcourse.course import forkserver
from ddpcourse.course.sandbox import zygote_for_this_process

FORKSERVER = "COURSE_FORKSERVER"


def pytest_configure(config):
    # OpenMP's idle threads sleep instead of spinning: with three tests at a time on two
    # cores, spinning threads burn the CPU the other processes wait for. The same thread
    # counts, so the same numbers. Set before the fork server starts (libgomp reads it once).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if JOB_CACHE not in os.environ:  # one folder per test session, removed at its end
        config._course_job_cache = tempfile.mkdtemp(prefix="course-jobs-")
        os.environ[JOB_CACHE] = config._course_job_cache
    jobcache.install()
    quick = config.getoption("markexpr", "") == "not slow"  # make test-fast: nothing to speed up
    if FORKSERVER not in os.environ and not os.environ.get("COURSE_FORKSERVER_OFF") and not quick:
        folder = tempfile.mkdtemp(prefix="course-forkserver-")
        config._course_forkserver = (folder, forkserver.start(folder))
        os.environ[FORKSERVER] = folder
        deadline = time.monotonic() + 60  # until then its stand-ins run the real interpreter
        while not os.path.exists(os.path.join(folder, "server.sock")):
            if time.monotonic() > deadline or config._course_forkserver[1].poll() is not None:
                break
            time.sleep(0.2)
    os.environ.setdefault("COURSE_REAL_PYTHON", sys.executable)
    # The grading sandboxes of the whole session fork from one warm template (as root).
    config._course_zygote = zygote_for_this_process()
    config._course_zygote.__enter__()
    if os.environ.get(FORKSERVER):  # this session's (or its xdist workers') processes use it
        sys.executable = os.path.join(os.environ[FORKSERVER], "python")


def pytest_unconfigure(config):
    zygote = getattr(config, "_course_zygote", None)
    if zygote is not None:
        zygote.__exit__(None, None, None)
    folder = getattr(config, "_course_job_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(JOB_CACHE, None)
    server = getattr(config, "_course_forkserver", None)
    if server:
        server[1].kill()
        server[1].wait()
        shutil.rmtree(server[0], ignore_errors=True)
        os.environ.pop(FORKSERVER, None)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group markers
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (make test: --dist loadgroup), keep the tests that share a module's
    job on one worker, and start the long tests first.

    A module- or session-scoped fixture runs once per worker that gets one of its tests: with
    the tests spread, the SLURM cluster and lesson 5's drills were each brought up twice
    (measured: 28-30 s and 21-23 s of extra work). And a long test that starts last finishes
    last, alone: a test's time limit is a fair guess at its length, so the longest limits go
    first (a stable sort keeps the rest in order).
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the usual order, so each module's fixtures are set up once
    for item in items:
        module = item.nodeid.split("::")[0]
        if any(defs[-1].scope in ("module", "session") and defs[-1].baseid == module
               for defs in item._fixtureinfo.name2fixturedefs.values() if defs):
            item.add_marker(pytest.mark.xdist_group(module))

    def limit(item):
        marker = item.get_closest_marker("timeout")
        return marker.args[0] if marker and marker.args else config.getini("timeout")
    items.sort(key=lambda item: -float(limit(item)))
