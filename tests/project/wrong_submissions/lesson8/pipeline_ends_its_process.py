"""l8_pipeline_step: 0 of 24. The process ends in pipeline_step (os._exit, as a crash, an abort or
an out-of-memory kill would end it): that exercise's checks are lost, and every other exercise,
checked after it in a fresh job or in a fresh sandbox, keeps its points."""

import os


def pipeline_step(*args, **kwargs):
    os._exit(3)
