"""l6_snapshot_state: 0 of 9. The process ends in restore_state (os._exit, as a crash, an abort or
an out-of-memory kill would end it): that exercise's checks are lost, and every other exercise,
checked after it in a fresh job or in a fresh sandbox, keeps its points."""

import os


def restore_state(*args, **kwargs):
    os._exit(3)
