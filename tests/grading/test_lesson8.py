"""Grading tests for lesson 8. bytes_per_rank is called here against the ZeRO paper's figures,
the arithmetic of every strategy and the edge inputs its docstring names. Zero1Optimizer
and pipeline_step run at 2 and 3 ranks as relayed jobs, one per check
(workers/lesson8_parallel.py: every rank a sandbox of its own, the relay in this process the
only road between them), in the world and in sub-groups whose group ranks are not global
ranks. The results are compared with one process and, for most of the points, the mechanism
is checked: the optimizer state each rank keeps (what the rank reports: its own memory) and
the bytes step() communicates; the messages between the pipeline's stages, their sizes and
order, and what it must refuse before it sends anything (the relay's record)."""


import math

import pytest
import torch
import torch.nn as nn

from ddpcourse.course.hidden import drawn
from ddpcourse.course.jobs import (
    graded,
    judge_once,
    relayed_report,
    verdict,
)
from ddpcourse.course.probes import (
    HIDDEN,
    PIPELINE_RUNS,
    ZERO_STEPS,
    lesson8_idle_model,
    lesson8_pipeline_batch,
    lesson8_stages,
    lesson8_zero_batch,
    lesson8_zero_model,
)

JOBS = {}  # no torchrun job: every check is a relayed job of its own (report below)
_secrets: list[int] = []  # the ranks' secrets of the job being judged


@pytest.fixture(scope="module")
def ex():
    yield from graded(8)


REFUSED_ANSWERS = ("predict", "plan_table", "zero_owners", "zero_stage_bytes", "stage_table",
                   "bytes_per_parameter")


@pytest.fixture(autouse=True)
def ready_made_answers_refused(ex):
    """The course's own arithmetic (ddpcourse.sharding, behind the lesson's tables) and
    torch's ZeroRedundancyOptimizer raise while the graded code runs, under any name (in the
    submission's process)."""
    def why(what):
        return f"{what} is a ready-made answer: write this one yourself"

    import ddpcourse.sharding as sharding
    refused = [("torch.distributed.optim", "ZeroRedundancyOptimizer.__init__",
                why("ZeroRedundancyOptimizer"))]
    refused += [("ddpcourse.sharding", name, why(f"ddpcourse.sharding.{name}"))
                for name in REFUSED_ANSWERS if hasattr(sharding, name)]
    with ex.options(refuse=refused):
        yield


# --- l8_memory_calculator ------------------------------------------------------------------

GB = 10**9
TERMS = ("params", "grads", "optimizer")
SHARDED = {"ddp": set(), "zero1": {"optimizer"}, "zero2": {"optimizer", "grads"},
           "zero3": set(TERMS), "fsdp": set(TERMS)}


def held(ex, *args, **kwargs):
    result = ex.bytes_per_rank(*args, **kwargs)
    assert set(result) == {*TERMS, "total"}, result
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in result.values()), result
    assert result["total"] == sum(result[t] for t in TERMS), result
    return result


@pytest.mark.l8_memory_calculator
@pytest.mark.points(2)
def test_the_zero_papers_example(ex):
    """The ZeRO paper's Figure 1: 7.5 B parameters, Adam in mixed precision, 64 GPUs:
    120 GB per GPU with plain data parallelism, 31.4 with stage 1, 16.6 with stage 2, 1.9
    with stage 3."""
    n = 7_500_000_000
    totals = {s: held(ex, n, 64, s, "adam", mixed_precision=True)["total"]
              for s in ("ddp", "zero1", "zero2", "zero3")}
    assert totals == {"ddp": 120 * GB, "zero1": 31_406_250_000, "zero2": 16_640_625_000,
                      "zero3": 1_875_000_000}, totals


@pytest.mark.l8_memory_calculator
@pytest.mark.points(2)
def test_seven_billion_parameters_on_eight_gpus(ex):
    n, w = 7 * GB, 8
    mixed = {"ddp": (14, 14, 84), "zero1": (14, 14, 10.5), "zero2": (14, 1.75, 10.5),
             "zero3": (1.75, 1.75, 10.5), "fsdp": (1.75, 1.75, 10.5)}
    fp32 = {"ddp": (28, 28, 56), "zero1": (28, 28, 7), "zero2": (28, 3.5, 7),
            "zero3": (3.5, 3.5, 7), "fsdp": (3.5, 3.5, 7)}
    for mixed_precision, table in ((True, mixed), (False, fp32)):
        for strategy, gigabytes in table.items():
            result = held(ex, n, w, strategy, "adam", mixed_precision=mixed_precision)
            got = tuple(result[t] / GB for t in TERMS)
            assert got == gigabytes, (strategy, mixed_precision, got, gigabytes)
    assert held(ex, n, w, "ddp", mixed_precision=True)["total"] == 112 * GB
    assert held(ex, n, w, "zero3", mixed_precision=True)["total"] == 14 * GB


@pytest.mark.l8_memory_calculator
@pytest.mark.points(1)
def test_each_optimizer_keeps_its_own_state(ex):
    """SGD keeps nothing, momentum one fp32 buffer, Adam two; mixed precision adds the fp32
    master weights to the optimizer's term and halves the weights and gradients."""
    n = 1000
    for optimizer, buffers in (("sgd", 0), ("sgd_momentum", 1), ("adam", 2)):
        assert held(ex, n, 1, "ddp", optimizer) == {
            "params": 4000, "grads": 4000, "optimizer": 4000 * buffers,
            "total": 8000 + 4000 * buffers}, optimizer
        assert held(ex, n, 1, "ddp", optimizer, mixed_precision=True) == {
            "params": 2000, "grads": 2000, "optimizer": 4000 + 4000 * buffers,
            "total": 8000 + 4000 * buffers}, optimizer
    assert held(ex, n, 4, "zero1", "sgd")["optimizer"] == 0
    assert held(ex, n, 4, "zero1", "sgd", mixed_precision=True)["optimizer"] == 1000


@pytest.mark.l8_memory_calculator
@pytest.mark.points(2)
def test_each_strategy_shards_its_own_terms(ex):
    """From 1 to W ranks, the terms a strategy shards shrink W times and the others stay;
    at W = 1 every strategy is DDP; fsdp is zero3; and three cases drawn at grading time."""
    n = 2 * 3 * 4 * 5 * 7 * 1000
    for optimizer in ("sgd_momentum", "adam"):
        for mixed_precision in (False, True):
            alone = held(ex, n, 1, "ddp", optimizer, mixed_precision=mixed_precision)
            for strategy, sharded in SHARDED.items():
                assert held(ex, n, 1, strategy, optimizer,
                            mixed_precision=mixed_precision) == alone, strategy
                for w in (2, 3, 4, 5, 7):
                    got = held(ex, n, w, strategy, optimizer, mixed_precision=mixed_precision)
                    for term in TERMS:
                        want = alone[term] // w if term in sharded else alone[term]
                        assert got[term] == want, (strategy, optimizer, mixed_precision, w,
                                                   term, got[term], want)
    assert held(ex, n, 6, "fsdp") == held(ex, n, 6, "zero3")
    hidden = drawn("strategy_shards")  # and three models and worlds drawn at grading time
    for _ in range(3):
        w = hidden.randint(8, 96)
        n = w * hidden.randint(1_000, 10_000_000)
        optimizer = hidden.choice(("sgd_momentum", "adam"))
        mixed_precision = hidden.random() < 0.5
        alone = held(ex, n, 1, "ddp", optimizer, mixed_precision=mixed_precision)
        for strategy, sharded in SHARDED.items():
            got = held(ex, n, w, strategy, optimizer, mixed_precision=mixed_precision)
            want = {term: alone[term] // w if term in sharded else alone[term] for term in TERMS}
            assert {term: got[term] for term in TERMS} == want, (
                f"bytes_per_rank({n}, {w}, {strategy!r}, {optimizer!r}, mixed_precision="
                f"{mixed_precision}) returned {got}; the terms it shards should be 1/{w} of one "
                f"rank's, the others whole: {want}")


@pytest.mark.l8_memory_calculator
@pytest.mark.points(1)
def test_a_shard_rounds_up(ex):
    """N parameters over W ranks: ceil(N / W) on every rank, the padding included; more ranks
    than parameters hold one each; one parameter on one rank is a model."""
    assert held(ex, 10, 4, "zero3", "sgd") == {"params": 12, "grads": 12, "optimizer": 0,
                                               "total": 24}
    assert held(ex, 3, 8, "zero2", "adam") == {"params": 12, "grads": 4, "optimizer": 8,
                                               "total": 24}
    assert held(ex, 1, 1, "fsdp", "sgd_momentum", mixed_precision=True) == {
        "params": 2, "grads": 2, "optimizer": 8, "total": 12}
    assert held(ex, 7, 8, "zero3", "adam", mixed_precision=True)["total"] == 16
    assert held(ex, 1_000_003, 3, "zero1", "adam") == {
        "params": 4_000_012, "grads": 4_000_012, "optimizer": 8 * 333_335,
        "total": 8_000_024 + 8 * 333_335}
    assert held(ex, 1001, 2, "zero2", "sgd_momentum", mixed_precision=True) == {
        "params": 2002, "grads": 2 * 501, "optimizer": 8 * 501, "total": 2002 + 10 * 501}


@pytest.mark.l8_memory_calculator
@pytest.mark.points(1)
def test_bad_input_is_refused(ex):
    for args, kwargs in [((0, 4, "ddp"), {}), ((-10, 4, "zero1"), {}), ((100, 0, "zero2"), {}),
                         ((100, -2, "zero3"), {}), ((100, 4, "zero4"), {}),
                         ((100, 4, "DDP-ish"), {}), ((100, 4, "fsdp"), {"optimizer": "lamb"}),
                         ((100, 4, "ddp"), {"optimizer": "Adam "})]:
        with pytest.raises(ValueError) as refused:
            ex.bytes_per_rank(*args, **kwargs)
        assert "\n" not in str(refused.value).strip(), (args, kwargs, str(refused.value))


# --- the jobs' judges ------------------------------------------------------------------------

TOLERANCE = 1e-5
OPTIMIZERS = [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, 1),   # (class, defaults,
              (torch.optim.Adam, {"lr": 0.01}, 2)]                    #  state buffers)


def summary(problems: list[str]) -> str:
    return "; ".join(list(dict.fromkeys(problems))[:6])  # the same problem on every rank: once


def plain_trained(make_model, optimizer_class, defaults) -> torch.Tensor:
    """The reference: the plain optimizer on the whole batch, ZERO_STEPS steps."""
    model = make_model()
    optimizer = optimizer_class(model.parameters(), **defaults)
    for step in range(ZERO_STEPS):
        x, y = lesson8_zero_batch(step)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def parameter_problems(mine, reference, who) -> list[str]:
    if not isinstance(mine, torch.Tensor) or mine.shape != reference.shape:
        return [f"{who}: the model's parameters did not come back"]
    diff = (mine - reference).abs().max().item()
    if not diff <= TOLERANCE:
        return [f"{who}: after {ZERO_STEPS} steps the parameters differ from the plain "
                f"optimizer's by {diff:.2e}"]
    return []


def largest_first(sizes, world):
    """The fullest rank's share under the rule in Zero1Optimizer's docstring."""
    held = [0] * world
    for size in sorted(sizes, reverse=True):
        held[held.index(min(held))] += size
    return max(held)


def shard_problems(facts, sizes, rank, size, who):
    """(problems, owners, elements of state kept) on this rank, which is `rank` of a group
    of `size`: one owner in 0..size-1 per parameter; one optimizer made, self.optimizer,
    over exactly the parameters this rank owns, with state for them only (none made, and
    self.optimizer None, where it owns none). Owners -1 where self.owners is no such list."""
    problems = []
    if facts["params_given"] is not True:
        problems.append(f"{who}: self.params is not the list of parameters given")
    owners = facts["owners"]
    if not isinstance(owners, list) or len(owners) != len(sizes) or \
            not all(o in range(size) for o in owners):
        problems.append(f"{who}: self.owners is not one rank in 0..{size - 1} per parameter "
                        "(ranks in the optimizer's group)")
        owners = [-1] * len(sizes)
    owned = {i for i, o in enumerate(owners) if o == rank}
    owned_numel = sum(sizes[i] for i in owned)
    made = facts["made"]
    if not owned and (made or facts["inner_none"] is not True):
        problems.append(f"{who}: this rank owns no parameter, yet {made} optimizers of "
                        "the class given were made; there must be none, self.optimizer None")
    elif owned and (made != 1 or facts["inner_is_made"] is not True):
        problems.append(f"{who}: {made} optimizers of the class given were made; there "
                        "must be one, self.optimizer, over this rank's shard")
    stepped = facts["stepped"]
    if set(stepped) != owned or len(stepped) != len(owned):
        problems.append(f"{who}: the optimizer holds {len(stepped)} parameters "
                        f"({sum(sizes[i] for i in stepped if i >= 0)} elements of the model's); "
                        f"this rank owns {len(owned)} ({owned_numel} elements)")
    kept = sum(numel for _, numel in facts["state"])
    foreign = sum(1 for i, _ in facts["state"] if i not in owned)
    if foreign:
        problems.append(f"{who}: state kept for {foreign} parameters other ranks own")
    return problems, owners, kept


def sharing(op: str) -> bool:
    return "broadcast" in op or gathering(op)


def gathering(op: str) -> bool:
    return "allgather" in op or "all_gather" in op


def share_problems(steps, sizes_bytes, owners, members, who):
    """What each step() moved on this rank, a member of the group of global ranks
    `members`: broadcast or all_gather only, on that group; no barrier, no message; in
    bytes, exactly the parameters' by broadcast, at most the group's size times the
    fullest shard by all_gather (the shards padded to equal length); in a group of one,
    nothing or the parameters' bytes."""
    size = len(members)
    needed = sum(sizes_bytes)
    if -1 in owners:
        fullest = largest_first(sizes_bytes, size)
    else:
        fullest = max(sum(b for b, o in zip(sizes_bytes, owners, strict=True) if o == r)
                      for r in range(size))
    problems = []
    for seen in steps:
        collectives = [c for c in seen["collectives"] if c[0] != "barrier"]
        barriers = len(seen["collectives"]) - len(collectives)
        wrong = sorted({op for op, *_ in collectives if not sharing(op)})
        if wrong:
            problems.append(f"{who}: step() called {', '.join(wrong)}; it should only "
                            "broadcast or all_gather the updated parameters")
        if barriers:
            problems.append(f"{who}: step() waited at {barriers} barrier(s) a step; a "
                            "broadcast already waits for its data")
        if seen["messages"]:
            problems.append(f"{who}: step() sent or received {len(seen['messages'])} "
                            "messages; use broadcast or all_gather")
        elsewhere = sorted({tuple(c[3]) for c in collectives if list(c[3]) != members})
        if elsewhere:
            problems.append(f"{who}: step() ran collectives on global ranks "
                            f"{', '.join(map(str, elsewhere))}; the optimizer's are {members}")
        # the relay records what each rank hands it: an all_gather's output is size times it
        moved = sum(nbytes * (size if gathering(op) else 1)
                    for op, _, nbytes, *_ in collectives if sharing(op))
        gathers = any(gathering(op) for op, *_ in collectives)
        if not (moved == needed or (gathers and needed <= moved <= size * fullest)
                or (size == 1 and moved == 0)):
            problems.append(f"{who}: a step() moved {moved} bytes by broadcast / all_gather; "
                            f"sharing the parameters takes {needed} by broadcast, at most "
                            f"{size} x the fullest shard = {size * fullest} by all_gather")
    return problems


@judge_once
def judge_zero1(seen):
    world = len(seen)
    sizes = [p.numel() for p in lesson8_zero_model().parameters()]
    found = {"zero1": [], "zero1_state": [], "zero1_balance": [], "zero1_gather": []}
    notes = []
    for i, (optimizer_class, defaults, buffers) in enumerate(OPTIMIZERS):
        name = optimizer_class.__name__
        reference = plain_trained(lesson8_zero_model, optimizer_class, defaults)
        runs = [observed[i] for observed in seen]
        kept_all, owners_all = [], []
        for rank, run in enumerate(runs):
            who = f"rank {rank}, {name}"
            if rank == 0 and isinstance(run["parameters"], torch.Tensor) and \
                    run["parameters"].shape == reference.shape:
                notes.append(f"{name} off by "
                             f"{(run['parameters'] - reference).abs().max():.1e}")
            found["zero1"] += parameter_problems(run["parameters"], reference, who)
            problems, owners, kept = shard_problems(run, sizes, rank, world, who)
            found["zero1_state"] += problems
            kept_all.append(kept)
            owners_all.append(owners)
            if -1 not in owners:
                held = [sum(s for s, o in zip(sizes, owners, strict=True) if o == r)
                        for r in range(world)]
                best = largest_first(sizes, world)
                if max(held) > best:
                    found["zero1_balance"].append(
                        f"{name}: the shards hold {held} elements; giving the largest "
                        f"parameter first to the emptiest rank fills none beyond {best}")
            else:
                found["zero1_balance"].append(
                    f"{name}: no owner per parameter to weigh (self.owners)")
            found["zero1_gather"] += share_problems(run["steps"], [4 * s for s in sizes],
                                                    owners, list(range(world)), who)
        firsts = runs[0]["parameters"]
        if any(not (isinstance(r["parameters"], torch.Tensor) and isinstance(firsts, torch.Tensor)
                    and r["parameters"].shape == firsts.shape
                    and torch.equal(r["parameters"], firsts)) for r in runs):
            found["zero1"].append(f"{name}: the ranks ended with different parameters")
        if any(o != owners_all[0] for o in owners_all):
            found["zero1_state"].append(f"{name}: the ranks disagree on who owns which "
                                        "parameter")
        full = buffers * sum(sizes)
        if sum(kept_all) != full:
            found["zero1_state"].append(
                f"{name}: the ranks keep {kept_all} elements of optimizer state, "
                f"{sum(kept_all)} in all; the model's full state is {full}, to be kept once")
    return {"zero1": (found["zero1"], "; ".join(notes)),
            **{name: (found[name], "") for name in ("zero1_state", "zero1_balance",
                                                   "zero1_gather")}}


@judge_once
def judge_zero1_group(seen):
    world = len(seen)
    members = [1] if world == 2 else [1, 2]
    where = f"in the group of global ranks {members}"
    sizes = [p.numel() for p in lesson8_zero_model().parameters()]
    reference = plain_trained(lesson8_zero_model, torch.optim.Adam, {"lr": 0.01})
    problems = []
    for rank, run in enumerate(seen):
        if rank not in members:
            continue
        group_rank = members.index(rank)
        who = f"rank {rank} (rank {group_rank} of the group of global ranks {members}), Adam"
        shard, owners, _ = shard_problems(run, sizes, group_rank, len(members), who)
        problems += (parameter_problems(run["parameters"], reference, who) + shard
                     + share_problems(run["steps"], [4 * s for s in sizes], owners, members,
                                      who))
    return problems, where


@judge_once
def judge_zero1_idle(seen):
    world = len(seen)
    model = lesson8_idle_model(world)
    sizes = [p.numel() for p in model.parameters()]
    reference = plain_trained(lambda: lesson8_idle_model(world), torch.optim.SGD,
                              {"lr": 0.1, "momentum": 0.9})
    problems = []
    for rank, run in enumerate(seen):
        who = f"rank {rank}, {len(sizes)} parameters on {world} ranks"
        problems += parameter_problems(run["parameters"], reference, who)
        shard, owners, _ = shard_problems(run, sizes, rank, world, who)
        problems += shard + share_problems(run["steps"], [4 * s for s in sizes], owners,
                                           list(range(world)), who)
    return problems, ""


def pipeline_result_problems(run, expected, loss, me, where):
    problems = []
    names = [n for n, _ in lesson8_stages()[me].named_parameters()]
    for name, got, want in zip(names, run["grads"], expected, strict=True):
        if got is None:
            problems.append(f"{where}: {name} has no gradient")
        elif not isinstance(got, torch.Tensor) or got.shape != want.shape:
            problems.append(f"{where}: the gradient of {name} has not its parameter's shape")
        elif not torch.allclose(got, want, rtol=1e-4, atol=1e-6):
            off = (got - want).abs().max().item()
            problems.append(f"{where}: the gradient of {name} differs from the unsplit model's "
                            f"(plus the {0.5} already there) by {off:.2e}")
    returned = run["returned"]
    if me == 0 and returned["kind"] != "None":
        problems.append(f"{where}: returned {returned['kind']}, not None")
    if me == 1:
        if returned["kind"] != "tensor" or returned["dim"] != 0:
            problems.append(f"{where}: returned {returned.get('shown', 'None')}, not the loss "
                            "as a 0-d tensor")
        elif returned["graph"] is not False:
            problems.append(f"{where}: the loss returned still carries its graph")
        elif abs(returned["value"].item() - loss) > 1e-5:
            problems.append(f"{where}: returned loss {returned['value'].item():.6f}; the whole "
                            f"batch's is {loss:.6f}")
    return problems


def pipeline_message_problems(run, micro, shape, me, where):
    problems = []
    if run["collectives"]:
        called = sorted({c[0] for c in run["collectives"]})
        problems.append(f"{where}: called {', '.join(called)}; a pipeline only sends and "
                        "receives")
    size = math.prod(shape)
    sent = [m for m in run["messages"] if m[0] == "send"]
    received = [m for m in run["messages"] if m[0] == "recv"]
    if len(sent) != micro or len(received) != micro:
        problems.append(f"{where}: sent {len(sent)} and received {len(received)} messages; one "
                        f"per micro-batch each way is {micro} and {micro}")
    sizes = sorted({(m[2], m[3]) for m in sent + received})
    if sizes and sizes != [(size, 4 * size)]:
        found = ", ".join(f"{n} elements ({b} bytes)" for n, b in sizes)
        problems.append(f"{where}: messages of {found}; one micro-batch's float32 activation "
                        f"(and its gradient) is {size} elements ({4 * size} bytes)")
    peers = {m[1] for m in sent} | {m[1] for m in received}
    if peers - {1 - me}:
        problems.append(f"{where}: messages with group ranks {sorted(peers, key=str)}; the "
                        f"other stage is group rank {1 - me}")
    return problems


def pipeline_schedule_problems(run, micro, me, where, counted):
    if counted:
        return [f"{where}: the messages are not one per micro-batch each way (see "
                "pipeline_messages), so the schedule cannot be read from them"]
    forward = "send" if me == 0 else "recv"
    kinds = [m[0] for m in run["messages"]]
    if kinds[:micro] != [forward] * micro:
        order = " ".join("A" if k == forward else "G" for k in kinds)
        return [f"{where}: activations (A) and gradients (G) crossed in the order {order}; "
                f"GPipe runs all {micro} forwards before the first backward"]
    return []


@judge_once
def judge_pipeline(seen):
    world = len(seen)
    members = [0, 1] if world == 2 else [1, 2]
    note = "the world" if world == 2 else "the group of ranks 1 and 2"
    found = {"pipeline": [], "pipeline_messages": [], "pipeline_schedule": []}
    for rank in members:
        me = members.index(rank)
        for (micro, batch), run in zip(PIPELINE_RUNS, seen[rank], strict=True):
            # The relay names peers by global rank: as group ranks, -1 outside the group.
            run = dict(run, messages=[
                (kind, members.index(peer) if peer in members else -1, numel, nbytes)
                for kind, peer, numel, nbytes in run["messages"]])
            x = lesson8_pipeline_batch(_secrets[members[0]], micro, batch)[0]
            y = lesson8_pipeline_batch(_secrets[members[1]], micro, batch)[1]
            first, second = lesson8_stages()
            loss = nn.functional.cross_entropy(second(first(x)), y)
            loss.backward()
            expected = [0.5 + p.grad for p in (first, second)[me].parameters()]
            shape = (batch // micro, HIDDEN)
            where = f"stage {me} (rank {rank}), {micro} micro-batches of {batch // micro}"
            found["pipeline"] += pipeline_result_problems(run, expected, loss.item(), me, where)
            counted = pipeline_message_problems(run, micro, shape, me, where)
            found["pipeline_messages"] += counted
            found["pipeline_schedule"] += pipeline_schedule_problems(run, micro, me, where,
                                                                     counted)
    return {name: (problems, note) for name, problems in found.items()}


def judge_refusals(seen, verdict_name):
    """What each rank's pipeline_step did with arguments it must refuse: a one-line
    ValueError, before any message or collective; every case each rank took part in."""
    world = len(seen)
    cases = {"pipeline_group_refused": lambda rank: 1 + (world != 2),
             "pipeline_split_refused": lambda rank: 2 if rank in ([0, 1] if world == 2
                                                                   else [1, 2]) else 0}
    problems = []
    for rank, outcomes in enumerate(seen):
        mine = [outcome for verdict, outcome in outcomes if verdict == verdict_name]
        if len(mine) != cases[verdict_name](rank):
            problems.append(f"rank {rank}: {len(mine)} of the cases were reported")
        for outcome in mine:
            who, raised = outcome["who"], outcome["raised"]
            if raised == "ValueError":
                if outcome["one_line"] is not True:
                    problems.append(f"{who}: the ValueError says more than one line")
                if outcome["messages"] or outcome["collectives"]:
                    problems.append(f"{who}: {len(outcome['messages'])} messages and "
                                    f"{len(outcome['collectives'])} collectives before the "
                                    "ValueError; refuse before sending or receiving anything")
            elif raised == "RanTheStage":
                problems.append(str(outcome["text"]))
            elif raised == "other":
                problems.append(f"{who}: {outcome['text']}, not a ValueError")
            else:
                problems.append(f"{who}: accepted; pipeline_step must raise ValueError")
    return problems, ""



VERDICTS = {
    **{name: ("zero1", lambda seen, n=name: judge_zero1(seen)[n])
       for name in ("zero1", "zero1_state", "zero1_balance", "zero1_gather")},
    "zero1_group": ("zero1_group", judge_zero1_group),
    "zero1_idle": ("zero1_idle", judge_zero1_idle),
    **{name: ("pipeline", lambda seen, n=name: judge_pipeline(seen)[n])
       for name in ("pipeline", "pipeline_messages", "pipeline_schedule")},
    **{name: ("pipeline_refusals", lambda seen, n=name: judge_refusals(seen, n))
       for name in ("pipeline_group_refused", "pipeline_split_refused")}}


def report(world_size, name):
    """The report of verdict `name` on the relayed job of its check at `world_size` ranks
    (launched once, shared by the verdicts of that check), judged here from what the ranks
    reported and the relay saw."""
    return relayed_report("lesson8_parallel.py", VERDICTS, name, world_size, secrets=_secrets,
                          summarise=summary)


def assert_ok(world_size, name):
    line = verdict(report(world_size, name), name)
    assert line.startswith(f"{name}: ok on {world_size} ranks"), line


def first_call(ex, exercise):
    """Before a job is launched for it, the exercise is called once in a world of one (once
    per grading run): an unfinished one fails here, in a second, not after a launch."""
    if exercise not in _first_calls:
        try:
            with ex.world_of_one():
                if exercise == "zero1":
                    ex.probe("zero1_first_call")
                else:  # it must refuse a world of one; code that does not is stopped at its
                    # stage, before it waits for a second rank that is not there
                    ex.probe("pipeline_in_a_world_of_one", (2, 2), 2, (1, 2))
            _first_calls[exercise] = None
        except NotImplementedError as error:
            _first_calls[exercise] = f"not written yet: {error}"
        except Exception:  # a pipeline in a world of one must refuse: graded on its own
            _first_calls[exercise] = None
    if _first_calls[exercise]:
        pytest.fail(_first_calls[exercise])


_first_calls: dict[str, str | None] = {}


# --- l8_zero1_optimizer --------------------------------------------------------------------

@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(1)
def test_zero1_in_a_world_of_one_is_the_plain_optimizer(ex):
    """In a world of one, Zero1Optimizer is the optimizer it wraps: one rank owns all."""
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    with ex.world_of_one():
        seen = ex.probe("zero1_in_a_world_of_one", x, y)
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    plain = torch.optim.Adam(reference.parameters(), lr=0.05)
    for _ in range(2):
        nn.functional.cross_entropy(reference(x), y).backward()
        plain.step()
        plain.zero_grad()
    assert all(g is None for g in seen["grads_after_zero_grad"]), \
        "zero_grad() must leave the gradients None"
    assert seen["owners"] == [0, 0, 0, 0]
    assert all(isinstance(g, torch.Tensor) and not g.any() for g in seen["grads_after"]), \
        "zero_grad(set_to_none=False) must leave zeros, not None"
    assert len(seen["params"]) == 4
    for p, q in zip(seen["params"], reference.parameters(), strict=True):
        assert isinstance(p, torch.Tensor) and p.shape == q.shape and \
            torch.allclose(p, q, atol=1e-6)


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero1_trains_like_the_plain_optimizer(ex, world_size):
    """SGD with momentum and Adam, 3 steps of a DDP model: every rank's parameters equal
    the plain optimizer's on the whole batch."""
    first_call(ex, "zero1")
    assert_ok(world_size, "zero1")


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero1_each_rank_keeps_only_its_shards_state(ex, world_size):
    """Every parameter has one owner; each rank made one optimizer, over exactly the
    parameters it owns; summed over the ranks the state is the full state, kept once."""
    first_call(ex, "zero1")
    assert_ok(world_size, "zero1_state")


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero1_step_shares_the_parameters_by_broadcast(ex, world_size):
    """step() communicates by broadcast or all_gather only, exactly the parameters' bytes
    per step (all_gather: padded to the fullest shard, no more): no all_reduce, no barrier,
    no messages, no second copy; and the parameters it shares are the right ones."""
    first_call(ex, "zero1")
    assert_ok(world_size, "zero1_gather")
    assert_ok(world_size, "zero1")


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero1_in_a_sub_group_ranks_are_group_ranks(ex, world_size):
    """In the group of global rank 1 alone (W = 2) and of global ranks 1 and 2 (W = 3):
    the parameters end right, owners are group ranks, each rank steps the shard of its
    group rank, and step() shares exactly the parameters' bytes within the group."""
    first_call(ex, "zero1")
    assert_ok(world_size, "zero1_group")


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(1)
def test_zero1_a_rank_may_own_no_parameter(ex):
    """More ranks than parameters (one at W = 2, two at W = 3): the rank that owns none
    makes no optimizer, every rank still ends with the right parameters, and step() still
    only shares the parameters (a second round of gradient traffic fails here too)."""
    first_call(ex, "zero1")
    assert_ok(2, "zero1_idle")
    assert_ok(3, "zero1_idle")


@pytest.mark.l8_zero1_optimizer
@pytest.mark.points(1)
def test_zero1_balances_the_shards_by_size(ex):
    """At 2 and 3 ranks, no rank holds more elements than the largest-first rule gives."""
    first_call(ex, "zero1")
    assert_ok(2, "zero1_balance")
    assert_ok(3, "zero1_balance")


# --- l8_pipeline_step ----------------------------------------------------------------------

@pytest.mark.l8_pipeline_step
@pytest.mark.points(1)
def test_pipeline_refuses_a_group_that_is_not_two_ranks(ex):
    """A world of one (here), a group of one and the world of three (in the jobs): a
    one-line ValueError, before the stage runs or any message is tried."""
    with ex.world_of_one(), pytest.raises(ValueError) as refused:
        ex.probe("pipeline_in_a_world_of_one", (4, 2), 2, (2, 2))
    assert "\n" not in str(refused.value).strip(), str(refused.value)
    first_call(ex, "pipeline")
    assert_ok(2, "pipeline_group_refused")
    assert_ok(3, "pipeline_group_refused")


@pytest.mark.l8_pipeline_step
@pytest.mark.points(1)
def test_pipeline_refuses_micro_batches_that_do_not_split_the_batch(ex):
    """A batch of 10 in 3 micro-batches, and 0 micro-batches, in the world of two and in
    the group of global ranks 1 and 2: a one-line ValueError on both stages, before either
    runs its stage or tries a message."""
    first_call(ex, "pipeline")
    assert_ok(2, "pipeline_split_refused")
    assert_ok(3, "pipeline_split_refused")


@pytest.mark.l8_pipeline_step
@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_pipeline_gradients_equal_the_unsplit_models(ex, world_size):
    """3 and 4 micro-batches, onto gradients already there; at W = 3 in the group of global
    ranks 1 and 2. Stage 1 returns the whole batch's loss."""
    first_call(ex, "pipeline")
    assert_ok(world_size, "pipeline")


@pytest.mark.l8_pipeline_step
@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 3])
def test_pipeline_sends_one_message_per_micro_batch_each_way(ex, world_size):
    """M activations forward, M gradients back, each one micro-batch's size, only between
    the two stages; no collective; and the gradients come out right."""
    first_call(ex, "pipeline")
    assert_ok(world_size, "pipeline_messages")
    assert_ok(world_size, "pipeline")


@pytest.mark.l8_pipeline_step
@pytest.mark.points(6)
@pytest.mark.parametrize("world_size", [2, 3])
def test_pipeline_runs_all_forwards_before_the_backwards(ex, world_size):
    """GPipe: every micro-batch's activation crosses before the first gradient does (and the
    gradients come out right)."""
    first_call(ex, "pipeline")
    assert_ok(world_size, "pipeline_schedule")
    assert_ok(world_size, "pipeline")
