"""Run under torchrun by the lesson 5 grading tests: my_devices() with the launcher's real
variables, on two simulated nodes of two processes and GPUS_PER_NODE GPUs each.

Every process works out its devices with the graded code; rank 0 collects them all (through
the launcher's store: no process group is needed) and checks that on each node the processes
own disjoint runs of consecutive GPUs that together cover the node, in local-rank order.
It prints `devices: ok on W ranks` or `devices: FAILED: ...`. --submissions A,B,... grades
several submission folders, one block after `### submission A` each.
"""

import argparse
import json
import os

from common import (
    RANK,
    WORLD,
    everyones_verdict,
    launcher_store,
    one_line,
    select_submission,
    submissions_to_grade,
)

from ddpcourse.exercises import load_exercises

GPUS_PER_NODE = 6  # 3 per process, unlike the 2 processes per node: neither stands in for the other
LOCAL_WORLD = int(os.environ["LOCAL_WORLD_SIZE"])


def my_answer() -> str:
    try:
        devices = load_exercises(5).my_devices(dict(os.environ), GPUS_PER_NODE)
        return json.dumps([int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"]),
                           [int(d) for d in devices]])
    except BaseException as error:  # the graded code raised: report it, as one line
        return json.dumps(f"rank {RANK}: {one_line(error)}")


def verdict(answers: list[str]) -> str:
    problems, nodes = [], {}
    for text in answers:
        answer = json.loads(text) if text.startswith(("[", '"')) else text
        if isinstance(answer, str):
            problems.append(answer)
            continue
        node, local_rank, devices = answer
        nodes.setdefault(node, {})[local_rank] = devices
    share = GPUS_PER_NODE // LOCAL_WORLD
    for node, claims in sorted(nodes.items()):
        for local_rank, devices in sorted(claims.items()):
            want = list(range(local_rank * share, (local_rank + 1) * share))
            if devices != want:
                problems.append(f"node {node}, local rank {local_rank} claims GPUs {devices}; "
                                f"with {GPUS_PER_NODE} GPUs over {LOCAL_WORLD} processes it "
                                f"owns {want}")
    if problems:
        return "devices: FAILED: " + "; ".join(problems[:4])
    return f"devices: ok on {WORLD} ranks"


def main():
    parser = argparse.ArgumentParser(description="lesson 5 grading checks")
    parser.add_argument("--submissions", default="")
    args = parser.parse_args()
    store = launcher_store()
    for i, submission in enumerate(submissions_to_grade(args.submissions)):
        select_submission(submission, store, tag=str(i))
        answers = everyones_verdict(store, f"lesson5/{i}/devices", my_answer())
        if RANK == 0:
            print(verdict(answers), flush=True)


if __name__ == "__main__":
    main()
