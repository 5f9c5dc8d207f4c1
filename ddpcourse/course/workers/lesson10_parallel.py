"""Run by the lesson 10 grading tests as the ranks of a relayed job (W = 3 and 4): one check
per job, each rank in a sandbox of its own whose only road to the others is the relay
(ddpcourse/course/relay.py); tests/grading/test_lesson10.py judges it.

What a rank reports is what the submission returned (the outputs, the gradients, the names
of the groups, whether a ValueError came) and, for the causal ring, the floating-point
operations of its matrix products (torch's FlopCounterMode: work inside one process, which
no one else can see). How the answer was computed (every message with its peer and size,
every collective with its members, every group with its timeout) is what the relay saw; in
the ring checks the relay refuses every ready-made collective. Each rank's attention block
and tokens come from a secret the relay gave that rank alone (probes.lesson10_*), so they
must travel.

  mesh_2d      W = 3: (dp, tp) = (3, 1) and (1, 3); W = 4: (2, 2). For each name: the
               names returned, then one all_reduce over the group (its members and timeout
               are the relay's record);
  mesh_3d      the same for (pp, dp, tp) = (1, 3, 1) at W = 3 and (2, 1, 2) at W = 4;
  mesh_refused a right mesh first, then a shape of W + 1 ranks, two names for one dimension
               and a name twice: each a ValueError, and the groups made meanwhile;
  ring, ring_causal, ring_large   ring_attention over the world;
  ring_group   causal, in the sub-groups of probes.lesson10_sub_groups (group ranks are not
               global ranks);
  moe, moe_empty   moe_dispatch over the world, then backward from its output: the output,
               the tokens' gradient, this rank's experts' gradients; the forward's
               collectives;
  moe_group    the same in the sub-groups;
  moe_refused  a right call first, then experts that do not divide by W, a wrong number of
               local experts, and an expert id out of range: each a ValueError, and the
               collectives meanwhile.

    python ddpcourse/course/workers/lesson10_parallel.py --check ring   (as a relayed rank)
"""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from ddpcourse.course.probes import (
    lesson10_attention_block,
    lesson10_experts,
    lesson10_share,
    lesson10_sub_groups,
)
from ddpcourse.course.workers import common
from ddpcourse.course.workers.common import RANK, WORLD, case, one_line, relayed_rank

# Short: code that leaves a rank waiting (a message never sent) costs its check this long.
GROUP_TIMEOUT = timedelta(seconds=20)
MESH_TIMEOUT = timedelta(seconds=17)  # what mesh_groups is asked for: the relay records it
MESH_WAIT = timedelta(seconds=8)      # an all_reduce over a returned group waits this long
torch.set_num_threads(1)
# FlopCounterMode has no formula for the CPU's attention kernel (what
# scaled_dot_product_attention runs here): without this, attention computed by that kernel
# block by block would count as no work at all.
ATTENTION_ON_CPU = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
                    lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v)}

MESHES = {"mesh_2d": {3: [(3, 1), (1, 3)], 4: [(2, 2)]},
          "mesh_3d": {3: [(1, 3, 1)], 4: [(2, 1, 2)]}}
NAMES = {2: ("dp", "tp"), 3: ("pp", "dp", "tp")}


def look_at_mesh(ex, shape):
    """The names mesh_groups returned and, per name, a case holding one all_reduce over the
    group it returned: the relay's record of it says which ranks the group has."""
    names = NAMES[len(shape)]
    made = case()
    groups = ex.mesh_groups(shape, names, MESH_TIMEOUT)
    seen = {"made": made, "names": sorted(groups) if isinstance(groups, dict) else None}
    for name in names:
        seen[name] = case()
        mark = torch.tensor([2.0 ** RANK], dtype=torch.float64)
        try:
            dist.all_reduce(mark, group=groups[name], async_op=True).wait(timeout=MESH_WAIT)
        except RuntimeError as error:  # a group some member never made: its record says
            seen[name]["error"] = one_line(error)
    return seen


def observe_mesh(kind):
    return lambda ex: [look_at_mesh(ex, shape) for shape in MESHES[kind][WORLD]]


def observe_mesh_refused(ex):
    first = look_at_mesh(ex, MESHES["mesh_2d"][WORLD][0])
    tries = []
    for shape, names in (((WORLD + 1,), ("dp",)), ((WORLD,), ("dp", "tp")),
                         ((1, WORLD), ("dp", "dp"))):
        tried = case()
        try:
            ex.mesh_groups(shape, names, MESH_TIMEOUT)
            tried["raised"] = None
        except ValueError as error:
            tried["raised"] = one_line(error)
        tries.append(tried)
    return {"first": first, "tries": tries}


def ring_call(ex, case_name, causal, group=None):
    q, k, v = lesson10_attention_block(case_name, common.SECRET)
    seen = case()
    with FlopCounterMode(display=False, custom_mapping=ATTENTION_ON_CPU) as flops:
        out = ex.ring_attention(q, k, v, group=group, causal=causal)
    return dict(seen, out=out, flops=flops.get_total_flops())


def observe_ring(case_name, causal):
    return lambda ex: ring_call(ex, case_name, causal)


def in_sub_group(call):
    def observe(ex):
        groups = [dist.new_group(ranks, timeout=GROUP_TIMEOUT)  # every rank makes each
                  for ranks in lesson10_sub_groups(WORLD)]
        for ranks, group in zip(lesson10_sub_groups(WORLD), groups, strict=True):
            if RANK in ranks:
                return {"group": ranks, **call(ex, group, ranks.index(RANK), len(ranks))}
        raise AssertionError("every rank is in a sub-group")
    return observe


def moe_call(ex, case_name, group=None, rank=RANK, world=WORLD):
    """The forward as one case (its collectives are the relay's), the backward as the next."""
    experts = lesson10_experts(world)
    mine = experts[2 * rank:2 * rank + 2]
    tokens, ids, probe = lesson10_share(case_name, world, rank, common.SECRET)
    tokens.requires_grad_()
    forward = case()
    out = ex.moe_dispatch(tokens, ids, mine, len(experts), group=group)
    backward = case()
    try:  # what a forward that autograd cannot go back through still earns
        (out * probe).sum().backward()
    except RuntimeError as error:
        backward["error"] = one_line(error)
    return {"forward": dict(forward, out=out.detach()),
            "backward": dict(backward, tokens=tokens.grad,
                             experts=[[p.grad for p in e.parameters()] for e in mine])}


def observe_moe(case_name):
    return lambda ex: moe_call(ex, case_name)


def observe_moe_refused(ex):
    first = moe_call(ex, "uneven")
    experts = lesson10_experts(WORLD)
    tokens, ids, _ = lesson10_share("uneven", WORLD, RANK, common.SECRET)
    mine = experts[2 * RANK:2 * RANK + 2]
    tries = []
    for args in ((tokens, ids, mine[:1], WORLD * 2 - 1),           # 2W - 1 experts over W ranks
                 (tokens, ids, mine[:1], len(experts)),             # one local expert of two
                 (tokens, ids * 0 + len(experts), mine, len(experts))):  # no such expert
        tried = case()
        try:
            ex.moe_dispatch(*args)
            tried["raised"] = None
        except ValueError as error:
            tried["raised"] = one_line(error)
        tries.append(tried)
    return {"first": first, "tries": tries}


CHECKS = {name: (observe, GROUP_TIMEOUT) for name, observe in {
    "mesh_2d": observe_mesh("mesh_2d"), "mesh_3d": observe_mesh("mesh_3d"),
    "mesh_refused": observe_mesh_refused,
    "ring": observe_ring("plain", False), "ring_causal": observe_ring("causal", True),
    "ring_large": observe_ring("large", False),
    "ring_group": in_sub_group(lambda ex, g, r, w: ring_call(ex, "causal", True, g)),
    "moe": observe_moe("uneven"), "moe_empty": observe_moe("empty"),
    "moe_group": in_sub_group(lambda ex, g, r, w: moe_call(ex, "uneven", g, r, w)),
    "moe_refused": observe_moe_refused}.items()}


if __name__ == "__main__":
    relayed_rank(10, CHECKS, "one lesson 10 grading check, as a relayed rank")
