"""Cases the student release does not show: drawn when the grading runs.

The visible cases of a test are written out in it (they teach, and a student may read them),
so a table of them would pass those. Each test that calls drawn(name) also checks cases drawn
here, from COURSE_HIDDEN_SEED: the instructor's secret, or one `make grade` / `grade-class`
drew for the run and printed (ddpcourse/course/grading.py), the same for every submission of
the run. The grader works out every drawn case's answer itself; the sandbox never sees the
seed (its environment is the grader's own short list, ddpcourse/course/sandbox.py).

    COURSE_HIDDEN_SEED=... make grade-class CLASS=...
"""

import os
import random
import secrets

SEED = os.environ.get("COURSE_HIDDEN_SEED", "").strip() or secrets.token_hex(8)  # pytest alone


# The names drawn so far in this process: the grading run's record (ScoreKeeper) marks each
# test that drew, so that Gradescope can hold its message back until the due date.
DRAWS: list[str] = []


def drawn(name: str) -> random.Random:
    """The generator of test `name`'s hidden cases: the same for every submission graded with
    one seed, unknown to the student."""
    DRAWS.append(name)
    return random.Random(f"{SEED}/{name}")
