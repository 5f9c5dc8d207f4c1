"""Run under torchrun by the lesson 9 grading tests, in the submission's sandbox:
exact_accuracy in a real job, with every collective the graded code starts recorded
(traffic.py). Each rank reports the value it got back (or what it raised) and its traffic;
tests/grading/test_lesson9.py rebuilds every rank's inputs (probes.lesson9_shares) and
judges.

  padded    each rank's share of a shuffled DistributedSampler over a set that does not
            divide by W (the padding evaluates some samples twice);
  uneven    shares by hand: one rank evaluated nothing, another some samples twice;
  groups    the world split into sub-groups, each its own validation set, all at once;
  missing   a sample no rank evaluated: every rank must raise;
  bad       indices and results of different lengths: refused before any collective.
Before each of the last two, the padded case once more: code that always raises earns
nothing there.

Each check runs in a process group of its own (common.py); --submissions A,B,... grades
several submission folders.
"""

from datetime import timedelta

import torch
import torch.distributed as dist
from common import RANK, WORLD, observe_each_submission, one_line
from probes import lesson9_groups, lesson9_shares
from traffic import Traffic

import ddpcourse.runtime  # noqa: F401  before init_process_group: see the comment there

# Short: a submission that leaves some ranks waiting (raising on one rank only) costs its
# check this long.
GROUP_TIMEOUT = timedelta(seconds=20)
torch.set_num_threads(1)


def call(ex, case, group=None, rank=RANK, world=WORLD):
    indices, correct, length = lesson9_shares(case, world, rank)
    with Traffic() as seen:
        try:
            value, raised = ex.exact_accuracy(indices, correct, length, group=group), None
        except ValueError as error:
            value, raised = None, one_line(error)
    return {"value": value, "raised": raised,
            "collectives": [(c.op, c.numel, list(c.ranks or ())) for c in seen.collectives],
            "messages": len(seen.messages)}


def observe_case(case):
    return lambda ex: call(ex, case)


def observe_refusal(case):
    """A right answer first (code that always raises earns nothing here), then the case."""
    return lambda ex: {"first": call(ex, "padded"), **call(ex, case)}


def observe_groups(ex):
    groups = [dist.new_group(ranks) for ranks in lesson9_groups(WORLD)]  # every rank makes each
    for i, ranks in enumerate(lesson9_groups(WORLD)):
        if RANK in ranks:
            return {"group": i, **call(ex, f"group{i}", groups[i], ranks.index(RANK),
                                       len(ranks))}
    raise AssertionError("every rank is in a group")


CHECKS = {"padded": observe_case("padded"), "uneven": observe_case("uneven"),
          "groups": observe_groups, "missing": observe_refusal("missing"),
          "bad": observe_refusal("bad")}


if __name__ == "__main__":
    observe_each_submission(9, CHECKS, GROUP_TIMEOUT, "lesson 9 grading checks")
