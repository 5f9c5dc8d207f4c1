"""Run by the lesson 8 grading tests as the ranks of a relayed job (W = 2 and 3): one
pipeline_step check per job, each rank in a sandbox of its own whose only road to the others
is the relay (ddpcourse/course/relay.py); tests/grading/test_lesson8.py judges it.

A small model is cut into two stages; group ranks 0 and 1 of a two-rank group run them (the
world at W = 2; the group of global ranks 1 and 2 at W = 3, where rank 0 looks on), with 3
and then 4 micro-batches, onto gradients already there. Stage 0's inputs and stage 1's labels
come from each one's secret (probes.lesson8_pipeline_batch), so neither stage can compute the
other's side: activations and gradients must travel. A rank reports what pipeline_step left
(its stage's gradients, what it returned); every message (its peer, size and order) and
collective is the relay's record.

  pipeline           one case per run: the gradients, what was returned; the messages;
  pipeline_refusals  pipeline_step handed what it must refuse: every rank in a group of one;
                     at W = 3 a group of all three; in the two stages' group, a batch of 10
                     in 3 micro-batches and a batch of 8 in 0. One case each: what it raised,
                     and the relay's messages and collectives meanwhile.

    python tests/grading/workers/lesson8_pipeline.py --check pipeline   (as a relayed rank)
"""

from datetime import timedelta

import common
import torch
import torch.distributed as dist
from common import RANK, WORLD, case, one_line, relayed_rank
from probes import HIDDEN, PIPELINE_RUNS, lesson8_pipeline_batch
from probes import lesson8_stages as stages

GROUP_TIMEOUT = timedelta(seconds=20)
# A refusal case's group: a stage that did not refuse and waits for the other, which did
# (or ran its stage and was stopped), fails after this, well inside the check's alarm.
REFUSAL_TIMEOUT = timedelta(seconds=3)
PIPELINE_GROUP = [0, 1] if WORLD == 2 else [1, 2]   # global ranks of the two stages
torch.set_num_threads(1)


def returned_facts(returned) -> dict:
    if returned is None:
        return {"kind": "None"}
    if not torch.is_tensor(returned):
        return {"kind": type(returned).__name__, "shown": f"{returned!r:.60}"}
    return {"kind": "tensor", "dim": returned.dim(), "shown": f"{returned!r:.60}",
            "graph": returned.grad_fn is not None or returned.requires_grad,
            "value": returned.detach().reshape(-1)[:1].clone()}


def observe_pipeline(ex):
    members = PIPELINE_GROUP
    group = None if WORLD == 2 else dist.new_group(members, timeout=GROUP_TIMEOUT)
    if RANK not in members:
        return None
    me = members.index(RANK)
    runs = []
    for micro, batch in PIPELINE_RUNS:
        mine = lesson8_pipeline_batch(common.SECRET, micro, batch)[me]
        stage = stages()[me]
        for p in stage.parameters():
            p.grad = torch.full_like(p, 0.5)  # gradients already there: a step adds to them
        shape = (batch // micro, HIDDEN)
        run = case()
        returned = ex.pipeline_step(stage, mine, micro, shape, group=group)
        runs.append(dict(run, grads=[p.grad for p in stage.parameters()],
                         returned=returned_facts(returned)))
    return runs


class RanTheStage(Exception):
    """Raised by a stage that pipeline_step should have refused to run."""


def observe_pipeline_refusals(ex):
    """[(verdict, what happened)] on this rank, for every case it takes part in; every rank
    makes every case's group, in one order."""
    cases = [("pipeline_group_refused", [r], 8, 2, "in a group of one") for r in range(WORLD)]
    cases += [("pipeline_split_refused", PIPELINE_GROUP, 10, 3,
               "a batch of 10 in 3 micro-batches"),
              ("pipeline_split_refused", PIPELINE_GROUP, 8, 0, "a batch of 8 in 0 micro-batches")]
    if WORLD != 2:
        cases.append(("pipeline_group_refused", list(range(WORLD)), 8, 2,
                      f"in a group of {WORLD}"))
    made = [dist.new_group(ranks, timeout=REFUSAL_TIMEOUT) for _, ranks, *_ in cases]
    outcomes = []
    for (verdict, ranks, batch_len, micro, what), group in zip(cases, made, strict=True):
        if RANK in ranks:
            me = min(ranks.index(RANK), 1)  # in a group of three, ranks 1 and 2 hold stage 1
            outcomes.append((verdict, refusal_outcome(ex, me, group, batch_len, micro, what)))
    return outcomes


def refusal_outcome(ex, me, group, batch_len, micro, what):
    """What pipeline_step as stage `me` did with arguments it must refuse (a one-line
    ValueError before it runs the stage or sends or receives anything)."""
    def must_not_run(module, args):
        raise RanTheStage(f"rank {RANK}, {what}: the stage ran; pipeline_step must refuse "
                          "its arguments before it runs anything")

    stage = stages()[me]
    stage.register_forward_pre_hook(must_not_run)
    g = torch.Generator().manual_seed(batch_len)
    batch = (torch.randn(batch_len, 10, generator=g) if me == 0
             else torch.randint(0, 5, (batch_len,), generator=g))
    shape = (batch_len // max(micro, 1), HIDDEN)
    seen = dict(case(), who=f"rank {RANK}, stage {me}, {what}")
    try:
        ex.pipeline_step(stage, batch, micro, shape, group=group)
    except ValueError as error:
        return dict(seen, raised="ValueError", one_line="\n" not in str(error).strip())
    except RanTheStage as error:
        return dict(seen, raised="RanTheStage", text=str(error))
    except Exception as error:  # the graded code ran: anything may come out
        return dict(seen, raised="other", text=one_line(error))
    return dict(seen, raised=None)


CHECKS = {"pipeline": (observe_pipeline, GROUP_TIMEOUT),
          "pipeline_refusals": (observe_pipeline_refusals, GROUP_TIMEOUT)}


if __name__ == "__main__":
    relayed_rank(8, CHECKS, "one lesson 8 pipeline check, as a relayed rank")
