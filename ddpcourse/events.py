"""The event logs lesson 6's drills read: one JSON object per line, appended by every rank of
the step script (--events), read while the job runs and after it."""

from __future__ import annotations

import json


def read_events(path) -> list[dict]:
    """The event log so far (one JSON object per complete line; a line being written is left
    for the next read). Several ranks append to it at once: short lines, opened in append
    mode, do not mix."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def attempts_of(steps: list[dict]) -> list[list[dict]]:
    """One rank's step records, split where its worker changed (a new pid: torchrun restarted
    the job), in the order they were written."""
    attempts: list[list[dict]] = []
    for e in steps:
        if not attempts or attempts[-1][-1]["pid"] != e["pid"]:
            attempts.append([])
        attempts[-1].append(e)
    return attempts
