"""A grading job's checks, each observed or ended: a mistake costs only the check it was in.

A grading worker (ddpcourse/course/workers/common.py) runs a lesson's checks one after another
and writes, with its observations, how far it got (STATE: the checks planned, whether the
exercises were imported, the check running, a check whose own group never formed). When a
rank ends the job (os._exit, a crash, a kill, too much memory) or sticks, the checks after
the one it was in have not run: `run_each_check` launches the job again for those alone, and
the check that ended it is recorded as such, an error for every rank. So each check runs at
most once, and a check of the submission's that ends its process costs that check only.

The one retry: a launch that failed for the grader's own reason before the submission's code
ran in it is launched again, at most RETRIES times, and each retry is recorded: a launch that
left no progress at all (its worker never began), or a check whose own process group never
formed while every rank was there (its code never started; the worker says so). Nothing the
submission did is tried again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

STATE = "__state__"     # the key the workers write their progress under (workers/common.py)
RETRIES = 2


def run_each_check(launch_once: Callable[[list[str]], subprocess.CompletedProcess],
                   world: int) -> subprocess.CompletedProcess:
    """launch_once(checks to skip) -> a launch's result, with .observations (its worker's
    dict, or None). Returns one result whose .observations hold every planned check (each
    observed, or ended), whose .retries list the grader's own relaunches and whose stdout and
    stderr are every launch's."""
    observed: dict = {}
    planned: list[str] | None = None
    retries: list[str] = []
    outputs = []
    while True:
        result = launch_once(list(observed))  # observed, or ended: not run again
        outputs.append(result)
        got = dict(result.observations or {}) if isinstance(result.observations, dict) else {}
        state = got.pop(STATE, None)
        if not isinstance(state, dict) or not isinstance(state.get("planned"), list):
            if state is None and planned is None and len(retries) < RETRIES:
                retries.append(f"launch {len(outputs)} ended before its worker began (exit "
                               f"status {result.returncode}): launched again")
                continue
            observed.update(got)  # a worker that does not say how far it got: as it is
            break
        planned = planned or [str(c) for c in state["planned"]]
        observed.update({k: v for k, v in got.items() if k in planned})
        remaining = [c for c in planned if c not in observed]
        if not remaining:
            break
        why = f"exit status {result.returncode}"
        if not state.get("imported"):
            for check in remaining:
                observed[check] = [{"error": f"importing the exercises ended the job ({why})"}
                                   ] * world
            break
        first = remaining[0]
        if state.get("harness_failed") == first and len(retries) < RETRIES:
            retries.append(f"{first}: its process group never formed (the grader's failure, "
                           "before its code ran): launched again")
            continue
        observed[first] = [{"error": f"a rank ended or stuck the job in this check ({why}); "
                                     "the checks after it ran in a fresh job"}] * world
        if len(remaining) == 1:
            break
    merged = subprocess.CompletedProcess(
        result.args, result.returncode,
        "".join(r.stdout or "" for r in outputs), "".join(r.stderr or "" for r in outputs))
    merged.observations = observed if (observed or planned) else result.observations
    merged.retries = retries
    return merged
