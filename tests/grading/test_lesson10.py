"""Grading tests for lesson 10. mesh_coordinates is called here on 1-, 2- and 3-D shapes and
edge inputs; mesh_groups, ring_attention and moe_dispatch run in the sandbox's world of one,
then each check of workers/lesson10_parallel.py at 3 and 4 ranks as a relayed job: every rank
in a sandbox of its own, and the relay, in this process, the only road between them
(ddpcourse/course/relay.py), in the world and in sub-groups whose group ranks are not global
ranks. The references (whole attention, every expert in one process, the groups of a
row-major mesh) are computed here, from the secrets the relay gave each rank. Most points
need the mechanism as well as the result, as the relay saw it: the groups' members and
timeout, a ring of messages and no collective, all-to-all carrying only the rows that move;
and the causal blocks skipped (counted inside the rank: work no one else can see)."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from ddpcourse.course.hidden import drawn
from ddpcourse.course.jobs import (
    graded,
    judge_once,
    one_line_value_error,
    relayed_report,
    verdict,
)
from ddpcourse.course.probes import (
    LESSON10_BLOCK,
    LESSON10_SHAPE,
    lesson10_attention,
    lesson10_block,
    lesson10_experts,
    lesson10_share,
    lesson10_sub_groups,
    lesson10_tokens,
)

JOBS = {}  # no torchrun job: every check is a relayed job of its own (assert_ok below)
MESH_TIMEOUT_S = 17.0  # what the worker asks mesh_groups for (workers/lesson10_parallel.py)
NAMES = {2: ("dp", "tp"), 3: ("pp", "dp", "tp")}
MESHES = {"mesh_2d": {3: [(3, 1), (1, 3)], 4: [(2, 2)]},
          "mesh_3d": {3: [(1, 3, 1)], 4: [(2, 1, 2)]}}
ALL_TO_ALL = {"alltoall_base", "alltoall"}  # the relay's names (relay.COLLECTIVES)
RING_CHECKS = {"ring", "ring_causal", "ring_large", "ring_group"}  # collectives refused
_secrets: list[int] = []  # the ranks' secrets of the job being judged


@pytest.fixture(scope="module")
def ex():
    yield from graded(10)


def assert_ok(world_size, name, verdicts):
    """Verdict `name` on the relayed job of its check at `world_size` ranks (launched once,
    shared by the verdicts of that check), judged here from what the relay saw."""
    report = relayed_report("lesson10_parallel.py", verdicts, name, world_size, secrets=_secrets,
                            refuse_collectives=verdicts[name][0] in RING_CHECKS)
    line = verdict(report, name)
    assert line == f"{name}: ok on {world_size} ranks", line


def secrets_of(ranks):
    """The secrets of these global ranks, in group-rank order: what their inputs came from."""
    return tuple(_secrets[r] for r in ranks)


def over_the_relay(got, what):
    """(the member ranks, the group's timeout) of the one all_reduce a name's case holds, as
    the relay saw it; or why not."""
    reduces = [c for c in got["collectives"] if c[0] == "allreduce"]
    if len(reduces) != 1:
        return None, f"{what}: {len(reduces)} all_reduce calls over it reached the relay " \
                     f"({got.get('error') or 'no error'}), not one"
    return (sorted(reduces[0][3]), reduces[0][4]), None


# --- l10_mesh_groups -----------------------------------------------------------------------

def row_major(rank, shape):
    return tuple((rank // math.prod(shape[d + 1:])) % shape[d] for d in range(len(shape)))


def mesh_group(rank, shape, dim):
    """The global ranks that differ from `rank` in dimension `dim` only."""
    mine = row_major(rank, shape)
    return [r for r in range(math.prod(shape))
            if all(c == m for d, (c, m) in enumerate(zip(row_major(r, shape), mine,
                                                         strict=True)) if d != dim)]


@pytest.mark.l10_mesh_groups
@pytest.mark.points(2)
def test_mesh_coordinates_are_row_major(ex):
    assert ex.mesh_coordinates(4, (2, 3)) == (1, 1)
    assert ex.mesh_coordinates(5, (2, 2, 2)) == (1, 0, 1)
    hidden = drawn("mesh_coordinates")  # and three shapes drawn at grading time (hidden.py)
    for shape in ((4,), (1,), (2, 3), (3, 2), (1, 4), (4, 1), (2, 1, 3), (3, 1, 1, 2),
                  (2, 2, 2), *(tuple(hidden.randint(1, 4) for _ in range(hidden.randint(1, 4)))
                               for _ in range(3))):
        got = [ex.mesh_coordinates(r, shape) for r in range(math.prod(shape))]
        want = [row_major(r, shape) for r in range(math.prod(shape))]
        assert got == want, (shape, got)
        assert all(type(c) is tuple and all(type(i) is int for i in c) for c in got), got


@pytest.mark.l10_mesh_groups
@pytest.mark.points(1)
def test_mesh_coordinates_refuse_what_is_no_mesh(ex):
    assert ex.mesh_coordinates(3, (2, 2)) == (1, 1)  # a right answer first
    for rank, shape in ((4, (2, 2)), (-1, (2, 2)), (0, ()), (0, (2, 0)), (0, (-2, 2)),
                        (8, (2, 1, 2))):
        one_line_value_error(ex.mesh_coordinates, rank, shape)


def judge_meshes(kind):
    """(groups problems, timeout problems): the ranks of each group, then its timeout."""
    def judge(seen):
        world = len(seen)
        wrong, slow = [], []
        for rank, per_shape in enumerate(seen):
            for shape, mine in zip(MESHES[kind][world], per_shape, strict=True):
                names = NAMES[len(shape)]
                if mine["names"] != sorted(names):
                    wrong.append(f"{shape}: rank {rank} got groups named {mine['names']}")
                    continue
                for dim, name in enumerate(names):
                    want = mesh_group(rank, shape, dim)
                    seen_by_relay, why = over_the_relay(
                        mine[name], f"{shape}: rank {rank}'s {name} group")
                    if why:
                        wrong.append(why)
                        continue
                    members, timeout = seen_by_relay
                    if members != want:
                        wrong.append(f"{shape}: an all_reduce over rank {rank}'s {name} group "
                                     f"reached ranks {members}, not {want}")
                    if timeout != MESH_TIMEOUT_S:
                        slow.append(f"{shape}: rank {rank}'s {name} group waits "
                                    f"{timeout} s, not the {MESH_TIMEOUT_S:g} s asked")
        return wrong, slow
    return judge_once(judge)


def mesh_verdicts():
    two, three = judge_meshes("mesh_2d"), judge_meshes("mesh_3d")
    return {"mesh_2d": ("mesh_2d", lambda seen: (two(seen)[0], "")),
            "mesh_3d": ("mesh_3d", lambda seen: (three(seen)[0], "")),
            "mesh_timeout_2d": ("mesh_2d", lambda seen: (two(seen)[0] or two(seen)[1], "")),
            "mesh_timeout_3d": ("mesh_3d", lambda seen: (three(seen)[0] or three(seen)[1], "")),
            "mesh_refused": ("mesh_refused", judge_mesh_refused)}


def judge_mesh_refused(seen):
    world = len(seen)
    problems = []
    shape = MESHES["mesh_2d"][world][0]
    for rank, mine in enumerate(seen):
        first = mine["first"]
        if first["names"] != ["dp", "tp"] or any(
                over_the_relay(first[n], n)[0] is None or
                over_the_relay(first[n], n)[0][0] != mesh_group(rank, shape, d)
                for d, n in enumerate(("dp", "tp"))):
            problems.append(f"rank {rank}: the right mesh {shape} first came out wrong")
        for what, tried in zip(("a shape of W + 1 ranks", "two names for one dimension",
                                "a name twice"), mine["tries"], strict=True):
            if not tried["raised"]:
                problems.append(f"rank {rank}: {what} was not refused with a ValueError")
            elif tried["groups"]:
                problems.append(f"rank {rank}: {len(tried['groups'])} group(s) made before "
                                f"refusing {what}")
    return problems, ""


@pytest.mark.l10_mesh_groups
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [3, 4])
def test_mesh_groups_of_a_2d_mesh(ex, world_size):
    """W = 3: (3, 1) and (1, 3), a dimension of one each way; W = 4: (2, 2)."""
    assert_ok(world_size, "mesh_2d", mesh_verdicts())


@pytest.mark.l10_mesh_groups
@pytest.mark.points(1)
def test_mesh_groups_of_a_3d_mesh(ex):
    """(1, 3, 1) at W = 3 and (2, 1, 2) at W = 4: the strides of every dimension."""
    for world_size in (3, 4):
        assert_ok(world_size, "mesh_3d", mesh_verdicts())


@pytest.mark.l10_mesh_groups
@pytest.mark.points(1)
def test_every_mesh_group_has_the_timeout_asked_for(ex):
    """Made without it, a gloo group waits 30 minutes for a rank that never comes."""
    for world_size in (3, 4):
        for name in ("mesh_timeout_2d", "mesh_timeout_3d"):
            assert_ok(world_size, name, mesh_verdicts())


@pytest.mark.l10_mesh_groups
@pytest.mark.points(1)
def test_mesh_groups_alone_and_refusals_before_any_group(ex):
    with ex.world_of_one():
        assert ex.probe("lesson10_alone", "mesh") == {"dp": [0], "tp": [0]}
    assert_ok(3, "mesh_refused", mesh_verdicts())


# --- l10_ring_attention --------------------------------------------------------------------

def attention(case, world, causal, secrets=None):
    q, k, v = (t.double() for t in lesson10_attention(case, world, secrets))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()


def close(got, want, case):
    tolerance = 1e-3 if case == "large" else 2e-5
    return isinstance(got, torch.Tensor) and got.shape == want.shape and \
        got.dtype == want.dtype and torch.allclose(got, want, atol=tolerance, rtol=1e-4)


def block_bytes():
    batch, heads, dim = LESSON10_SHAPE
    return batch * heads * LESSON10_BLOCK * dim * 4


def ring_problems(mine, case, causal, rank, members, where):
    """(output problems, mechanism problems, structure problems) of one rank's ring_call. The
    structure: a rank exchanges blocks with one peer each way, its ring neighbours, whichever
    way the ring turns; blocks sent straight to every rank are the all-gather the ring exists
    to avoid, and their right outputs do not count as the ring's. The relay names peers by
    global rank; `members` (the group's global ranks) turns them into group ranks."""
    world = len(members)
    want = lesson10_block(attention(case, world, causal, secrets_of(members)), rank)
    if mine["refused"]:
        return [f"{where}: called {mine['refused'][0]}"], [], []
    if not close(mine["out"], want, case):
        return [f"{where}: the output differs from attention in one process"], [], []
    in_group = [(kind, members.index(peer) if peer in members else -1, numel, nbytes)
                for kind, peer, numel, nbytes in mine["messages"]]
    sent = [m for m in in_group if m[0] == "send"]
    received = [m for m in in_group if m[0] == "recv"]
    peers_out, peers_in = {m[1] for m in sent}, {m[1] for m in received}
    structure = []
    if world > 1 and (len(peers_out) > 1 or len(peers_in) > 1 or not (
            peers_out | peers_in) <= {(rank + 1) % world, (rank - 1) % world}):
        structure.append(f"{where}: right, but not by a ring: it sent to {sorted(peers_out)} "
                         f"and received from {sorted(peers_in)} (group ranks); in a ring each "
                         "rank passes blocks to one neighbour and gets them from the other")
    mechanism = []
    if world > 1:
        if {m[1] for m in sent} != {(rank + 1) % world} or \
                {m[1] for m in received} != {(rank - 1) % world}:
            mechanism.append(f"{where}: sent to {sorted({m[1] for m in sent})} and received "
                             f"from {sorted({m[1] for m in received})} (group ranks): a ring "
                             f"sends to {(rank + 1) % world} and receives from "
                             f"{(rank - 1) % world} only")
        expected = 2 * (world - 1) * block_bytes()
        for kind, moved in (("sent", sent), ("received", received)):
            if sum(m[3] for m in moved) != expected:
                mechanism.append(f"{where}: {kind} {sum(m[3] for m in moved)} bytes; W - 1 "
                                 f"hops of a K and a V block are {expected}")
    elif mine["messages"]:
        mechanism.append(f"{where}: {len(mine['messages'])} messages in a group of one")
    return [], mechanism, structure


def judge_ring(case, causal, sub_groups=False):
    def judge(seen):
        world, results, mechanism, structure = len(seen), [], [], []
        for rank, mine in enumerate(seen):
            r, members, where = rank, list(range(world)), f"rank {rank}"
            if sub_groups:
                members = lesson10_sub_groups(world)[0 if rank == 0 else 1]
                r, where = members.index(rank), f"rank {rank} (group {members})"
            wrong, how, shape = ring_problems(mine, case, causal, r, members, where)
            results += wrong
            mechanism += how
            structure += shape
        return results, mechanism, structure
    return judge_once(judge)


def judge_causal_skips(seen):
    """The matrix products of a causal ring: query block r against key blocks 0..r only."""
    batch, heads, dim = LESSON10_SHAPE
    one_block = 2 * 2 * batch * heads * LESSON10_BLOCK * LESSON10_BLOCK * dim  # QK^T, then PV
    problems = []
    for rank, mine in enumerate(seen):
        if mine["flops"] > (rank + 1) * one_block:
            problems.append(f"rank {rank}: {mine['flops']} floating-point operations in matrix "
                            f"products; key blocks 0..{rank} need {(rank + 1) * one_block}")
    return problems


def ring_verdicts():
    plain, causal = judge_ring("plain", False), judge_ring("causal", True)
    large, group = judge_ring("large", False), judge_ring("causal", True, sub_groups=True)

    def result(judge):
        return lambda seen: (judge(seen)[0], "")

    def result_by_a_ring(judge):
        return lambda seen: (judge(seen)[0] or judge(seen)[2], "")

    def result_and_mechanism(judge):
        return lambda seen: (judge(seen)[0] or judge(seen)[1], "")

    return {"ring": ("ring", result_by_a_ring(plain)),
            "ring_causal": ("ring_causal", result_by_a_ring(causal)),
            "ring_large": ("ring_large", result_by_a_ring(large)),
            "ring_messages": ("ring", result_and_mechanism(plain)),
            "ring_causal_messages": ("ring_causal", result_and_mechanism(causal)),
            "ring_skips": ("ring_causal", lambda seen: (
                causal(seen)[0] or judge_causal_skips(seen), "")),
            "ring_group": ("ring_group", result_and_mechanism(group))}


@pytest.mark.l10_ring_attention
@pytest.mark.points(1)
def test_ring_attention_in_a_world_of_one(ex):
    with ex.world_of_one():
        for case in ("plain", "causal"):
            got = ex.probe("lesson10_alone", case)
            assert close(got, attention(case, 1, case == "causal"), case), case
        refused = ex.probe("lesson10_alone", "refused")
        assert refused and refused.startswith("ValueError") and "\n" not in refused, refused


@pytest.mark.l10_ring_attention
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [3, 4])
def test_ring_attention_equals_attention_in_one_process(ex, world_size):
    assert_ok(world_size, "ring", ring_verdicts())


@pytest.mark.l10_ring_attention
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [3, 4])
def test_causal_ring_attention_equals_attention_in_one_process(ex, world_size):
    assert_ok(world_size, "ring_causal", ring_verdicts())


@pytest.mark.l10_ring_attention
@pytest.mark.points(1)
def test_ring_attention_with_large_scores(ex):
    """Scores in the hundreds: the online softmax keeps a running maximum."""
    for world_size in (3, 4):
        assert_ok(world_size, "ring_large", ring_verdicts())


@pytest.mark.l10_ring_attention
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [3, 4])
def test_ring_attention_passes_k_and_v_round_a_ring(ex, world_size):
    """Each rank sends to the next and receives from the one before, W - 1 hops of a K and a
    V block each way, causal or not (the ring still turns), and no collective."""
    for name in ("ring_messages", "ring_causal_messages"):
        assert_ok(world_size, name, ring_verdicts())


@pytest.mark.l10_ring_attention
@pytest.mark.points(1)
def test_causal_ring_attention_skips_the_blocks_no_query_sees(ex):
    for world_size in (3, 4):
        assert_ok(world_size, "ring_skips", ring_verdicts())


@pytest.mark.l10_ring_attention
@pytest.mark.points(1)
def test_ring_attention_in_sub_groups(ex):
    """Group ranks are not global ranks; rank 0 is a group of one."""
    for world_size in (3, 4):
        assert_ok(world_size, "ring_group", ring_verdicts())


# --- l10_moe_dispatch ----------------------------------------------------------------------

@functools.cache
def moe_reference(case, world, secrets=None):
    """Every rank's output, tokens' gradient, and every expert's gradients (None: no token
    reached it), all experts in one process; with `secrets`, from the relayed ranks'."""
    experts = lesson10_experts(world)
    shares = lesson10_tokens(case, world, secrets)
    outs, tokens_grads, loss = [], [], 0
    leaves = []
    for tokens, ids, probe in shares:
        tokens = tokens.clone().requires_grad_()
        leaves.append(tokens)
        rows = [experts[int(e)](tokens[i]) for i, e in enumerate(ids)]
        out = torch.stack(rows) if rows else torch.zeros(0, probe.shape[1])
        outs.append(out.detach())
        loss = loss + (out * probe).sum()
    loss.backward()
    tokens_grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]
    grads = [[p.grad for p in e.parameters()] for e in experts]
    return outs, tokens_grads, grads


def same(got, want):
    """A tensor equal to `want`; for an empty `want` (a rank without tokens), None too."""
    if got is None:
        return want.numel() == 0
    return isinstance(got, torch.Tensor) and got.shape == want.shape and \
        torch.allclose(got, want, atol=1e-5, rtol=1e-4)


def no_gradient_or_zero(got):
    return got is None or (isinstance(got, torch.Tensor) and not (got.abs() > 0).any())


def moe_problems(mine, case, rank, members, where):
    """(output problems, gradient problems, traffic problems, structure problems) of one
    rank's moe_call. The structure: rows travel by all-to-all; an all-reduce or all-gather
    of every token gives every rank all of them, and its right outputs do not count as the
    dispatch's. mine: the forward's case (the output, its collectives) and the backward's."""
    world = len(members)
    outs, tokens_grads, grads = moe_reference(case, world, secrets_of(members))
    forward, after = mine["forward"], mine["backward"]
    if not same(forward["out"], outs[rank]):
        return [f"{where}: the output differs from the experts run in one process"], [], [], []
    elsewhere = [(op, nbytes) for op, numel, nbytes, *_ in forward["collectives"]
                 if op not in ALL_TO_ALL]
    structure = []
    if sum(nbytes for _, nbytes in elsewhere) > 8 * 2 * world * world:  # counts at most
        structure.append(f"{where}: right, but the tokens travelled by {elsewhere[0][0]} "
                         f"({sum(n for _, n in elsewhere)} bytes): every rank got every "
                         "token, where an all-to-all sends each row only to its expert's rank")
    backward = [f"{where}: backward failed: {after['error']}"] if after.get("error") else []
    if not backward and not same(after["tokens"], tokens_grads[rank]):
        backward.append(f"{where}: the tokens' gradient differs from one process's (or none)")
    for i, got in enumerate(after["experts"]):
        for g, want in zip(got, grads[2 * rank + i], strict=True):
            if not (no_gradient_or_zero(g) if want is None else same(g, want)):
                backward.append(f"{where}: expert {2 * rank + i}'s gradient differs from one "
                                "process's (or none)")
                break
    traffic = []
    kinds = {op for op, *_ in forward["collectives"]}
    if kinds - ALL_TO_ALL:
        traffic.append(f"{where}: {sorted(kinds - ALL_TO_ALL)[0]} in the forward: only "
                       "all-to-all moves tokens to their experts")
    shares = [lesson10_share(case, world, r) for r in range(world)]  # the ids: no secret
    d_in, d_out = shares[0][0].shape[1], shares[0][2].shape[1]
    here = range(2 * rank, 2 * rank + 2)
    arriving = sum(int(sum((ids == e).sum() for e in here)) for _, ids, _ in shares)
    mine_count = len(shares[rank][0])
    # The rows that must move (the relay counts what each rank hands it: its rows out, then
    # its experts' results back; at most the larger of either way round), and the counts
    # (integers, or floats: at most one per expert and rank).
    need = 4 * max(arriving * d_in + mine_count * d_out, mine_count * d_in + arriving * d_out)
    float_bytes = sum(nbytes for _, numel, nbytes, *_ in forward["collectives"]
                      if numel and nbytes == 4 * numel)
    if float_bytes > need + 4 * 2 * world * world:
        traffic.append(f"{where}: {float_bytes} bytes of rows exchanged where {need} must move")
    return [], backward, traffic, structure


def judge_moe(case, sub_groups=False):
    def judge(seen):
        world, out, back, traffic, structure = len(seen), [], [], [], []
        for rank, mine in enumerate(seen):
            r, members, where = rank, list(range(world)), f"rank {rank}"
            if sub_groups:
                members = lesson10_sub_groups(world)[0 if rank == 0 else 1]
                r, where = members.index(rank), f"rank {rank} (group {members})"
            a, b, c, d = moe_problems(mine, case, r, members, where)
            out, back, traffic, structure = out + a, back + b, traffic + c, structure + d
        return out, back, traffic, structure
    return judge_once(judge)


def judge_moe_refused(seen):
    problems = []
    forward = judge_moe("uneven")
    first = forward([mine["first"] for mine in seen])
    problems += [f"before the refusals, {p}" for p in first[0] + first[1]]
    for rank, mine in enumerate(seen):
        for what, tried in zip(("experts that W does not divide", "one local expert of two",
                                "an expert id out of range"), mine["tries"], strict=True):
            if not tried["raised"]:
                problems.append(f"rank {rank}: {what} was not refused with a ValueError")
            elif tried["collectives"]:
                problems.append(f"rank {rank}: {len(tried['collectives'])} collective(s) "
                                f"before refusing {what}")
    return problems, ""


def moe_verdicts():
    uneven, empty = judge_moe("uneven"), judge_moe("empty")
    group = judge_moe("uneven", sub_groups=True)
    def by_all_to_all(judge, then):
        """The outputs right, the rows moved by all-to-all, and `then` (the gradients)."""
        return lambda seen: (judge(seen)[0] or judge(seen)[3] or judge(seen)[then], "")

    return {"moe": ("moe", lambda seen: (uneven(seen)[0], "")),
            "moe_backward": ("moe", by_all_to_all(uneven, 1)),
            "moe_traffic": ("moe", lambda seen: (uneven(seen)[0] or uneven(seen)[2], "")),
            "moe_empty": ("moe_empty", by_all_to_all(empty, 1)),
            "moe_group": ("moe_group", by_all_to_all(group, 1)),
            "moe_refused": ("moe_refused", judge_moe_refused)}


@pytest.mark.l10_moe_dispatch
@pytest.mark.points(1)
def test_moe_dispatch_in_a_world_of_one(ex):
    outs, tokens_grads, grads = moe_reference("uneven", 1)
    with ex.world_of_one():
        got = ex.probe("lesson10_alone", "moe")
    assert same(got["out"], outs[0]), "the output differs from the experts in one process"
    assert same(got["tokens"], tokens_grads[0]), "the tokens' gradient differs"
    for mine, want in zip(got["experts"], grads, strict=True):
        for g, w in zip(mine, want, strict=True):
            assert no_gradient_or_zero(g) if w is None else same(g, w), "an expert's gradient"


@pytest.mark.l10_moe_dispatch
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [3, 4])
def test_moe_dispatch_sends_each_token_to_its_expert_and_back(ex, world_size):
    assert_ok(world_size, "moe", moe_verdicts())


@pytest.mark.l10_moe_dispatch
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [3, 4])
def test_moe_dispatch_is_differentiable_across_ranks(ex, world_size):
    """The tokens' gradient comes back from the experts' ranks; each expert's gradient sums
    every rank's tokens that reached it."""
    assert_ok(world_size, "moe_backward", moe_verdicts())


@pytest.mark.l10_moe_dispatch
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [3, 4])
def test_moe_dispatch_moves_only_the_rows_that_must_move(ex, world_size):
    """All-to-all only, uneven splits: no padding to equal splits, no copies for every rank."""
    assert_ok(world_size, "moe_traffic", moe_verdicts())


@pytest.mark.l10_moe_dispatch
@pytest.mark.points(1)
def test_moe_dispatch_with_a_rank_and_experts_without_tokens(ex):
    for world_size in (3, 4):
        assert_ok(world_size, "moe_empty", moe_verdicts())


@pytest.mark.l10_moe_dispatch
@pytest.mark.points(1)
def test_moe_dispatch_in_sub_groups(ex):
    for world_size in (3, 4):
        assert_ok(world_size, "moe_group", moe_verdicts())


@pytest.mark.l10_moe_dispatch
@pytest.mark.points(1)
def test_moe_dispatch_refuses_bad_input_before_any_collective(ex):
    assert_ok(3, "moe_refused", moe_verdicts())

