"""l1_identity: 0 of 6. The process ends while it reports its identity (os._exit, as a crash, an
abort or an out-of-memory kill would end it): that check is lost on every rank, and node_groups,
which the job checks after it in a fresh job, keeps its points."""

import os


def identity_from_env(environ):
    os._exit(3)
