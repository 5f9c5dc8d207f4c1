"""Run under torchrun by the lesson 5 grading tests, in the submission's sandbox: my_devices()
with the launcher's real variables, on two simulated nodes of two processes and GPUS_PER_NODE
GPUs each. Each process reports the devices the graded code gave it; tests/grading/
test_lesson5.py judges them (on each node, disjoint runs of consecutive GPUs that together
cover the node, in local-rank order). --submissions A,B,... grades several folders.
"""

import os
from datetime import timedelta

from ddpcourse.course.workers.common import observe_each_submission

GPUS_PER_NODE = 6  # 3 per process, unlike the 2 processes per node: neither stands in for the other


def observe_devices(ex):
    return [int(d) for d in ex.my_devices(dict(os.environ), GPUS_PER_NODE)]


if __name__ == "__main__":
    observe_each_submission(5, {"devices": observe_devices}, timedelta(seconds=30),
                            "lesson 5 grading checks")
