"""l10_moe_dispatch: 0 of 10. The process ends in moe_dispatch (os._exit, as a crash, an abort or
an out-of-memory kill would end it): that exercise's checks are lost, and every other exercise,
checked after it in a fresh job or in a fresh sandbox, keeps its points."""

import os


def moe_dispatch(*args, **kwargs):
    os._exit(3)
