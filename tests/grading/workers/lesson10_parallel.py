"""Run under torchrun by the lesson 10 grading tests (W = 3 and 4), in the submission's
sandbox: mesh_groups, ring_attention and moe_dispatch in a real job, with every collective and
message the graded code starts recorded (traffic.py). Each rank reports what it got and saw;
tests/grading/test_lesson10.py rebuilds every input (probes.lesson10_*), computes the one
process references and decides.

  mesh_2d      W = 3: (dp, tp) = (3, 1) and (1, 3); W = 4: (2, 2). For each name: the ranks of
               the group returned, its timeout, and the sum of 2^rank all-reduced over it
               (run only where the group has the short timeout asked for: a group left with
               gloo's 30 minutes is not waited on);
  mesh_3d      the same for (pp, dp, tp) = (1, 3, 1) at W = 3 and (2, 1, 2) at W = 4;
  mesh_refused a right mesh first, then a shape of W + 1 ranks, two names for one dimension
               and a name twice: each a ValueError, with the groups that exist counted before
               and after;
  ring, ring_causal, ring_large   ring_attention over the world, every collective refused:
               the output, the messages (peer, bytes) and the floating-point operations of
               its matrix products (torch's FlopCounterMode);
  ring_group   causal, in the sub-groups of probes.lesson10_sub_groups (group ranks are not
               global ranks);
  moe, moe_empty   moe_dispatch over the world, then backward from its output: the output,
               the tokens' gradient, this rank's experts' gradients, and the collectives of
               the forward;
  moe_group    the same in the sub-groups;
  moe_refused  a right call first, then experts that do not divide by W, a wrong number of
               local experts, and an expert id out of range: each a ValueError, with the
               collectives started before it.

Each check runs in a process group of its own (common.py); --submissions A,B,... grades
several submission folders.
"""

from datetime import timedelta

import torch
import torch.distributed as dist
from common import RANK, WORLD, observe_each_submission, one_line
from probes import (
    lesson10_attention,
    lesson10_block,
    lesson10_experts,
    lesson10_sub_groups,
    lesson10_tokens,
)
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count
from traffic import Traffic, collectives_refused

import ddpcourse.runtime  # noqa: F401  before init_process_group: see the comment there

# Short: code that leaves a rank waiting (a message never sent) costs its check this long.
GROUP_TIMEOUT = timedelta(seconds=20)
MESH_TIMEOUT = timedelta(seconds=17)  # what mesh_groups is asked for: the grader reads it back
torch.set_num_threads(1)
# FlopCounterMode has no formula for the CPU's attention kernel (what
# scaled_dot_product_attention runs here): without this, attention computed by that kernel
# block by block would count as no work at all.
ATTENTION_ON_CPU = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
                    lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v)}

MESHES = {"mesh_2d": {3: [(3, 1), (1, 3)], 4: [(2, 2)]},
          "mesh_3d": {3: [(1, 3, 1)], 4: [(2, 1, 2)]}}
NAMES = {2: ("dp", "tp"), 3: ("pp", "dp", "tp")}


def groups_made() -> int:
    # Private, but the one count of every group this process belongs to or helped make.
    return len(dist.distributed_c10d._world.pg_group_ranks)


def timeout_of(group) -> float | None:
    # Private: a group's timeout is not in the public API; gloo keeps it in its options.
    try:
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except Exception:
        return None


def look_at_mesh(ex, shape):
    names = NAMES[len(shape)]
    groups = ex.mesh_groups(shape, names, MESH_TIMEOUT)
    seen = {"names": sorted(groups) if isinstance(groups, dict) else None}
    for name in names:
        group = groups[name]
        ranks = dist.get_process_group_ranks(group)
        timeout = timeout_of(group)
        total = None
        if timeout is not None and timeout <= MESH_TIMEOUT.total_seconds():
            mark = torch.tensor([2.0 ** RANK], dtype=torch.float64)
            dist.all_reduce(mark, group=group)
            total = int(mark.item())
        seen[name] = {"ranks": list(ranks), "timeout": timeout, "sum": total}
    return seen


def observe_mesh(kind):
    return lambda ex: [look_at_mesh(ex, shape) for shape in MESHES[kind][WORLD]]


def observe_mesh_refused(ex):
    first = look_at_mesh(ex, MESHES["mesh_2d"][WORLD][0])
    tries = []
    for shape, names in (((WORLD + 1,), ("dp",)), ((WORLD,), ("dp", "tp")),
                         ((1, WORLD), ("dp", "dp"))):
        before = groups_made()
        try:
            ex.mesh_groups(shape, names, MESH_TIMEOUT)
            raised = None
        except ValueError as error:
            raised = one_line(error)
        tries.append({"raised": raised, "groups_made": groups_made() - before})
    return {"first": first, "tries": tries}


def ring_call(ex, case, causal, group=None, rank=None, world=None):
    rank, world = (RANK, WORLD) if group is None else (rank, world)
    q, k, v = (lesson10_block(t, rank) for t in lesson10_attention(case, world))
    refused = []
    with collectives_refused(refused), Traffic() as seen, \
            FlopCounterMode(display=False, custom_mapping=ATTENTION_ON_CPU) as flops:
        out = ex.ring_attention(q, k, v, group=group, causal=causal)
    return {"out": out, "refused": refused, "flops": flops.get_total_flops(),
            "messages": [(m.kind, m.peer, m.nbytes) for m in seen.messages]}


def observe_ring(case, causal):
    return lambda ex: ring_call(ex, case, causal)


def in_sub_group(call):
    def observe(ex):
        groups = [dist.new_group(ranks, timeout=GROUP_TIMEOUT)  # every rank makes each
                  for ranks in lesson10_sub_groups(WORLD)]
        for ranks, group in zip(lesson10_sub_groups(WORLD), groups, strict=True):
            if RANK in ranks:
                return {"group": ranks, **call(ex, group, ranks.index(RANK), len(ranks))}
        raise AssertionError("every rank is in a sub-group")
    return observe


def moe_call(ex, case, group=None, rank=None, world=None):
    rank, world = (RANK, WORLD) if group is None else (rank, world)
    experts = lesson10_experts(world)
    mine = experts[2 * rank:2 * rank + 2]
    tokens, ids, probe = lesson10_tokens(case, world)[rank]
    tokens.requires_grad_()
    with Traffic() as seen:
        out = ex.moe_dispatch(tokens, ids, mine, len(experts), group=group)
    try:  # what a forward that autograd cannot go back through still earns
        (out * probe).sum().backward()
        backward = None
    except RuntimeError as error:
        backward = one_line(error)
    return {"out": out.detach(), "tokens": tokens.grad, "backward": backward,
            "experts": [[p.grad for p in e.parameters()] for e in mine],
            "collectives": [(c.op, c.numel, c.nbytes, list(c.ranks or ()))
                            for c in seen.collectives]}


def observe_moe(case):
    return lambda ex: moe_call(ex, case)


def observe_moe_refused(ex):
    first = moe_call(ex, "uneven")
    experts = lesson10_experts(WORLD)
    tokens, ids, _ = lesson10_tokens("uneven", WORLD)[RANK]
    mine = experts[2 * RANK:2 * RANK + 2]
    tries = []
    for args in ((tokens, ids, mine[:1], WORLD * 2 - 1),           # 2W - 1 experts over W ranks
                 (tokens, ids, mine[:1], len(experts)),             # one local expert of two
                 (tokens, ids * 0 + len(experts), mine, len(experts))):  # no such expert
        with Traffic() as seen:
            try:
                ex.moe_dispatch(*args)
                raised = None
            except ValueError as error:
                raised = one_line(error)
        tries.append({"raised": raised, "collectives": len(seen.collectives)})
    return {"first": first, "tries": tries}


CHECKS = {"mesh_2d": observe_mesh("mesh_2d"), "mesh_3d": observe_mesh("mesh_3d"),
          "mesh_refused": observe_mesh_refused,
          "ring": observe_ring("plain", False), "ring_causal": observe_ring("causal", True),
          "ring_large": observe_ring("large", False),
          "ring_group": in_sub_group(lambda ex, g, r, w: ring_call(ex, "causal", True, g, r, w)),
          "moe": observe_moe("uneven"), "moe_empty": observe_moe("empty"),
          "moe_group": in_sub_group(lambda ex, g, r, w: moe_call(ex, "uneven", g, r, w)),
          "moe_refused": observe_moe_refused}


if __name__ == "__main__":
    observe_each_submission(10, CHECKS, GROUP_TIMEOUT, "lesson 10 grading checks")
