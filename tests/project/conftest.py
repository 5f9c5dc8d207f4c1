"""The course's own tests share each job: see COURSE_JOB_CACHE in ddpcourse/launch.py."""

import os
import shutil
import tempfile

from ddpcourse.launch import JOB_CACHE


def pytest_configure(config):
    if JOB_CACHE not in os.environ:  # one folder per test session, removed at its end
        config._course_job_cache = tempfile.mkdtemp(prefix="course-jobs-")
        os.environ[JOB_CACHE] = config._course_job_cache


def pytest_unconfigure(config):
    folder = getattr(config, "_course_job_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(JOB_CACHE, None)
