"""l3_average_gradients: 0 of 4. The process ends in average_gradients (os._exit, as a crash, an
abort or an out-of-memory kill would end it): that exercise's checks are lost, and every other
exercise, checked after it in a fresh job or in a fresh sandbox, keeps its points."""

import os


def average_gradients(*args, **kwargs):
    os._exit(3)
