"""Run by the lesson 9 grading tests as the ranks of a relayed job (W = 2 and 3): one check
per job, each rank in a sandbox of its own whose only road to the others is the relay
(ddpcourse/course/relay.py). Each rank reports the value exact_accuracy gave back (or what it
raised); its collectives and messages are the relay's record, one case per call;
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

    python ddpcourse/course/workers/lesson9_validation.py --check padded   (as a relayed rank)
"""

from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse.course.probes import lesson9_groups, lesson9_shares
from ddpcourse.course.workers.common import RANK, WORLD, case, one_line, relayed_rank

# Short: a submission that leaves some ranks waiting (raising on one rank only) costs its
# check this long.
GROUP_TIMEOUT = timedelta(seconds=20)
torch.set_num_threads(1)


def call(ex, name, group=None, rank=RANK, world=WORLD):
    indices, correct, length = lesson9_shares(name, world, rank)
    seen = case()
    try:
        value, raised = ex.exact_accuracy(indices, correct, length, group=group), None
    except ValueError as error:
        value, raised = None, one_line(error)
    return dict(seen, value=value, raised=raised)


def observe_case(name):
    return lambda ex: call(ex, name)


def observe_refusal(name):
    """A right answer first (code that always raises earns nothing here), then the case."""
    return lambda ex: {"first": call(ex, "padded"), "then": call(ex, name)}


def observe_groups(ex):
    groups = [dist.new_group(ranks, timeout=GROUP_TIMEOUT)  # every rank makes each
              for ranks in lesson9_groups(WORLD)]
    for i, ranks in enumerate(lesson9_groups(WORLD)):
        if RANK in ranks:
            return {"group": i, **call(ex, f"group{i}", groups[i], ranks.index(RANK),
                                       len(ranks))}
    raise AssertionError("every rank is in a group")


CHECKS = {name: (observe, GROUP_TIMEOUT) for name, observe in {
    "padded": observe_case("padded"), "uneven": observe_case("uneven"),
    "groups": observe_groups, "missing": observe_refusal("missing"),
    "bad": observe_refusal("bad")}.items()}


if __name__ == "__main__":
    relayed_rank(9, CHECKS, "one lesson 9 grading check, as a relayed rank")
