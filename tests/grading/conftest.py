"""Grading tests: every test carries one exercise marker (l<lesson>_<name>) and points(n).

Run them through `make grade` for a score table, or directly for one exercise:
    .venv/bin/pytest tests/grading -m l1_identity
COURSE_IMPL / COURSE_SUBMISSION choose the code under test (see ddpcourse.course.grading).
"""

import os
from pathlib import Path

import pytest

# Before any test makes a process group (some build DDP in this process): see the comment
# on the import of torch.distributed.nn there.
import ddpcourse.runtime  # noqa: F401
from ddpcourse.course.grading import ScoreKeeper

# A test that sets no timeout of its own gets this many seconds: a student's endless loop
# costs that exercise, not the whole grading run.
DEFAULT_TIMEOUT = float(os.environ.get("COURSE_TEST_TIMEOUT", "60"))


def pytest_configure(config):
    results = os.environ.get("COURSE_RESULTS")
    config.pluginmanager.register(ScoreKeeper(Path(results) if results else None),
                                  "course-scorekeeper")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT))
