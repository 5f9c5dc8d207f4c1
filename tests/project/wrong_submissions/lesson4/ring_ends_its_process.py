"""l4_ring_allreduce: 0 of 10. The process ends inside the ring (os._exit, as a crash, an abort or
an out-of-memory kill would end it): the ranks of every job lose that check, and the checks
after it, run in a fresh job, keep every other exercise's points."""

import os


def ring_all_reduce(tensor):
    os._exit(3)
