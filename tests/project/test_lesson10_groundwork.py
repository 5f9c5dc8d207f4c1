"""Groundwork for lesson 10, run for real on gloo: ring attention by hand (context parallelism)
equals scaled_dot_product_attention in one process, causal and not, in its output and in the
gradients of Q, K and V, and each rank sends exactly the predicted bytes (W - 1 hops of a K and
a V block forward; backward, K and V W - 1 hops and their gradients W hops); a mixture of
experts spread over the ranks by all_to_all_single equals the same layer in one process, in
its output and every gradient, and hands all_to_all_single exactly (rows sent + rows received)
x hidden x 4 bytes each way. Odd world sizes included (3).

Each job is launched once (module-scoped fixtures) and checked several ways.
"""

import re

import pytest
from util import PYTHON, ROOT, run, summary

from ddpcourse.cluster.launch import launch
from ddpcourse.report import parse_table

# Lesson 10's runs of 3 to 8 processes run in `make test-lesson10` (CI too): with them
# `make test` would pass its five minutes.
pytestmark = pytest.mark.lesson10

RING = "scripts/experiments/lesson10_ring_attention.py"
MOE = "scripts/experiments/lesson10_moe.py"
TOLERANCE = 1e-5
# lesson10_ring_attention.py's defaults: batch 2, 2 heads, 120 positions, head dim 16, float32
BATCH, HEADS, SEQ, HEAD_DIM = 2, 2, 120, 16
# lesson10_moe.py's defaults: 24 tokens per rank of 16 features, 2 experts per rank
TOKENS, HIDDEN = 24, 16
MOE_JOBS = {1: [], 3: ["--top-k", "2"], 4: []}  # top-2 at W = 3, top-1 elsewhere


def launched(script: str, args: list[str], world: int) -> str:
    result = launch(script, args, nproc=world, timeout=90, capture=True, echo=False,
                    backend="gloo", cwd=str(ROOT))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def ring_job():
    jobs = {}

    def output(world: int) -> str:
        if world not in jobs:
            jobs[world] = launched(RING, [], world)
        return jobs[world]
    return output


@pytest.fixture(scope="module")
def moe_job():
    jobs = {}

    def output(world: int) -> str:
        if world not in jobs:
            jobs[world] = launched(MOE, MOE_JOBS[world], world)
        return jobs[world]
    return output


def table_after(text: str, heading: str) -> list[dict[str, str]]:
    """The table printed after the line that starts with `heading`."""
    return parse_table(text[text.index(heading):])


# --- ring attention --------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [1, 3])
def test_ring_attention_equals_attention_in_one_process(world, ring_job):
    out = ring_job(world)
    rows = {row["attention"]: row for row in parse_table(out)}
    assert sorted(rows) == ["causal", "full"], out
    for row in rows.values():
        for name in ("out", "dQ", "dK", "dV"):
            assert float(row[f"{name} diff"]) < TOLERANCE, row
    facts = summary(out)
    assert facts["world_size"] == str(world) and facts["same_as_one_process"] == "True"
    assert float(facts["max_diff"]) < TOLERANCE, facts


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [1, 3])
def test_each_rank_sends_the_predicted_bytes_around_the_ring(world, ring_job):
    out = ring_job(world)
    block_bytes = 4 * BATCH * HEADS * (SEQ // world) * HEAD_DIM  # one K (or V) block
    hops, home = world - 1, (world if world > 1 else 0)
    forward, backward = 2 * hops, 2 * (hops + home)  # messages: K and V, then their gradients
    rows = table_after(out, "sent by each rank")
    assert len(rows) == 2 * world, out
    for row in rows:
        rank = int(row["rank"])
        # causal: a query block needs the key blocks up to its own only; the ring turns anyway
        computed = rank + 1 if row["attention"] == "causal" else world
        assert row["blocks computed"] == f"{computed} of {world}", row
        assert row["forward msgs"] == f"{forward} ({forward})", row
        assert row["backward msgs"] == f"{backward} ({backward})", row
        assert int(row["forward bytes"]) == int(row["forward predicted"]) == forward * block_bytes
        assert int(row["backward bytes"]) == int(row["backward predicted"]) == (
            backward * block_bytes)
    facts = summary(out)
    assert facts["traffic_as_predicted"] == "True" and facts["block_bytes"] == str(block_bytes)


# --- mixture of experts ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", sorted(MOE_JOBS))
def test_experts_over_all_to_all_equal_the_layer_in_one_process(world, moe_job):
    out = moe_job(world)
    diffs = dict(re.findall(r"^largest \|difference\| from one process, ([\w ]+): (\S+)$", out,
                            re.M))
    assert sorted(diffs) == ["expert weight grads", "input grad", "output", "router grad"], out
    assert all(float(d) < TOLERANCE for d in diffs.values()), diffs
    experts = parse_table(out)
    assert len(experts) == 2 * world, out  # every expert's weights' gradients, one by one
    assert all(float(row["weight grad diff"]) < TOLERANCE for row in experts), experts
    assert "routing: the same experts chosen for every token" in out
    facts = summary(out)
    assert facts["world_size"] == str(world) and facts["same_as_one_process"] == "True"
    assert facts["top_k"] == ("2" if "--top-k" in MOE_JOBS[world] else "1")


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", sorted(MOE_JOBS))
def test_all_to_all_carries_the_predicted_bytes(world, moe_job):
    out = moe_job(world)
    top_k = 2 if "--top-k" in MOE_JOBS[world] else 1
    row_bytes = 4 * HIDDEN
    experts = parse_table(out)
    ranks = table_after(out, "all_to_all_single per rank")
    assert len(ranks) == world, out
    loads = [int(row["tokens"]) for row in experts]
    assert sum(loads) == world * TOKENS * top_k  # no token dropped, none counted twice
    for row in ranks:
        rank = int(row["rank"])
        got = sum(loads[2 * rank:2 * rank + 2])  # the tokens routed to this rank's 2 experts
        assert int(row["rows sent"]) == TOKENS * top_k and int(row["rows received"]) == got
        predicted = (TOKENS * top_k + got) * row_bytes  # dispatch out, combine back
        assert int(row["predicted"]) == predicted, row
        assert int(row["forward bytes"]) == int(row["backward bytes"]) == predicted, row
        measured, expected = re.fullmatch(r"(\d+) \((\d+)\)", row["to other ranks"]).groups()
        assert measured == expected and int(measured) <= predicted, row
        if world == 1:
            assert measured == "0", row  # one rank: nothing leaves it
        assert int(row["counts bytes"]) == 8 * 2 * world, row  # one int64 per expert
    assert summary(out)["bytes_as_predicted"] == "True"


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("script, args, message", [
    (RING, ["--seq-len", "121"], "error: --seq-len 121 does not split into 2 equal blocks; use a "
                                 "multiple of 2"),
    (MOE, ["--experts", "3"], "error: --experts 3 does not split evenly over 2 ranks; use a "
                              "multiple of 2"),
])
def test_a_world_that_does_not_split_is_refused_in_one_line(script, args, message):
    result = launch(script, args, nproc=2, timeout=90, capture=True, echo=False,
                    backend="gloo", cwd=str(ROOT))
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors[0] == message and len(errors) == 2, result.stderr[-2000:]  # + torchrun's
    assert "summary:" not in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    ([RING, "--heads", "0"], "must be at least 1"),
    ([RING, "--seq-len", "many"], "invalid int value: 'many'"),
    ([MOE, "--top-k", "3"], "invalid choice: 3"),
    ([MOE, "--experts", "1", "--top-k", "2"], "--experts must be at least --top-k (2)"),
    ([MOE, "--tokens", "0"], "must be at least 1"),
])
def test_bad_arguments_are_one_line(args, message):
    result = run([PYTHON, *args], timeout=60)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("script", [RING, MOE])
def test_help_names_the_experiment(script):
    result = run([PYTHON, script, "--help"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Lesson 10 experiment:" in result.stdout and "--timeout" in result.stdout
