"""Every test, and every process a test starts, runs on the CPU with gloo.

On a GPU machine the scripts would pick nccl, which needs one GPU per process: a test with
4 processes on a 1-GPU machine could not run. Hiding the GPUs keeps the tests and grading
the same everywhere. (The scripts' GPU path is exercised by running the lessons on a GPU.)
"""

import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""

from ddpcourse.course.lessons import exercise_markers  # noqa: E402


def pytest_configure(config):
    # One marker per exercise, from the lessons' own lesson.toml (see ddpcourse/course/lessons.py).
    for marker, text in exercise_markers().items():
        config.addinivalue_line("markers", f"{marker}: {text}")
