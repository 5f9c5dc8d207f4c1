"""Shared bits of the project's own tests."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable  # a fork server's stand-in (tests/project/conftest.py)
REAL_PYTHON = os.environ.get("COURSE_REAL_PYTHON", sys.executable)


def run(cmd, timeout=120, env=None, cwd=ROOT, **kwargs):
    """Run a command with a wall-clock limit and return its CompletedProcess (text)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout, **kwargs)
