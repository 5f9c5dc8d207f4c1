"""l7_accumulate_no_sync: 0 of 12. The process ends in accumulation_step (os._exit, as a crash, an
abort or an out-of-memory kill would end it): that exercise's checks are lost, and every other
exercise, checked after it in a fresh job or in a fresh sandbox, keeps its points."""

import os


def accumulation_step(*args, **kwargs):
    os._exit(3)
