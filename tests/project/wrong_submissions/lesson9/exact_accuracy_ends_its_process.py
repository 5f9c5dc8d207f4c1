"""l9_exact_validation: 0 of 11. The process ends in exact_accuracy (os._exit, as a crash, an abort
or an out-of-memory kill would end it): that exercise's checks are lost, and every other
exercise, checked after it in a fresh job or in a fresh sandbox, keeps its points."""

import os


def exact_accuracy(*args, **kwargs):
    os._exit(3)
