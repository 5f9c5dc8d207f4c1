"""Lesson 4: the collectives, groups, failure drill and benchmark scripts, run for real.

The pictures' model (ddpcourse.figures.collectives) is checked on its own, and the collectives
script checks every real collective against it, so the figures show what torch does.
"""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from util import PYTHON, ROOT, run

from ddpcourse.cluster.launch import launch
from ddpcourse.collectives import (
    NOT_DEFINED,
    format_values,
    ring_allreduce_steps,
    simulate,
    starting_states,
    values,
)
from ddpcourse.figures.collectives import FIGURE_ORDER, draw

ALLREDUCE_BENCH = "scripts/experiments/lesson4_allreduce_bench.py"


def sections(stdout: str) -> dict[str, list[list[str]]]:
    """The collectives script's tables: 'name: call' -> rows of [rank, before, after]."""
    found = {}
    for block in stdout.split("\n\n"):
        lines = block.strip().splitlines()
        if len(lines) < 4 or not re.match(r"^[a-z_]+: ", lines[0]):
            continue
        body = [line for line in lines[2:] if line[:1].isdigit()]
        found[lines[0]] = [re.split(r"\s{2,}", line.strip()) for line in body]
    return found


# --- the model behind the pictures -------------------------------------------------------

@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_model_of_each_collective(world):
    start = values(starting_states("all_reduce", world))
    total = [sum(10 * r + 1 for r in range(world)), sum(10 * r + 2 for r in range(world))]
    assert values(simulate("all_reduce", start)) == [[total]] * world
    assert values(simulate("all_reduce", start, op="max")) == [start[-1]] * world
    assert values(simulate("all_reduce", start, op="avg")) == [[[t / world for t in total]]] * world
    reduced = values(simulate("reduce", start, root=world - 1))
    assert reduced[world - 1] == [total] and reduced[:-1] == [NOT_DEFINED] * (world - 1)
    assert values(simulate("broadcast", start, root=world - 1)) == [start[-1]] * world
    gathered = [chunk for s in start for chunk in s]
    assert values(simulate("gather", start)) == [gathered] + [None] * (world - 1)
    assert values(simulate("all_gather", start)) == [gathered] * world
    pieces = values(starting_states("scatter", world))
    assert values(simulate("scatter", pieces)) == [[p] for p in pieces[0]]
    lists = values(starting_states("reduce_scatter", world))
    assert values(simulate("reduce_scatter", lists)) == [
        [[sum(10 * q + r + 1 for q in range(world))]] for r in range(world)]
    if world > 1:
        assert values(simulate("send_recv", start)) == [start[(r - 1) % world]
                                                        for r in range(world)]
    else:
        with pytest.raises(ValueError, match="two ranks"):
            simulate("send_recv", start)
    assert format_values([[1.0, 2.5], [3.0]]) == "[1, 2.5] [3]"


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_ring_allreduce_steps_follow_the_algorithm(world):
    stages = ring_allreduce_steps(world)
    assert len(stages) == 1 + 2 * (world - 1)
    everyone = frozenset(range(world))
    if world > 1:
        after_reduce_scatter = stages[world - 1]["held"]
        for r in range(world):  # rank r holds the complete sum of chunk r+1, and only that one
            complete = [c for c in range(world) if after_reduce_scatter[r][c] == everyone]
            assert complete == [(r + 1) % world]
    assert all(chunk == everyone for rank in stages[-1]["held"] for chunk in rank)
    for stage in stages[1:]:  # every rank receives exactly one chunk per step
        assert all(c is not None for c in stage["received"])


@pytest.mark.slow
def test_every_picture_draws_for_odd_and_even_worlds():
    import matplotlib.pyplot as plt

    for world in (1, 3):
        for name in FIGURE_ORDER:
            if name == "send_recv" and world == 1:
                continue
            plt.close(draw(name, world))


# --- the scripts ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
def test_collectives_on_three_ranks_match_the_model():
    result = launch("scripts/lesson4_collectives.py", nproc=3, timeout=120, capture=True,
                    echo=False, cwd=str(ROOT))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    assert "check: 15 of 15 results match the model" in out
    assert re.search(r"^summary: world_size=3 backend=gloo collectives=15 matches_model=15/15 ",
                     out, re.M)
    tables = sections(out)
    assert tables["broadcast: dist.broadcast(x, src=0)"] == [
        ["0", "[1, 2]", "[1, 2]"], ["1", "[11, 12]", "[1, 2]"], ["2", "[21, 22]", "[1, 2]"]]
    reduced = tables["reduce: dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)"]
    assert reduced[0] == ["0", "[1, 2]", "[33, 36]"]
    assert all("not defined" in " ".join(row[2:]) for row in reduced[1:])
    assert [row[2] for row in tables["all_reduce: dist.all_reduce(x, op=dist.ReduceOp.SUM)"]] \
        == ["[33, 36]"] * 3
    assert [row[2] for row in tables[
        "all_reduce: dist.all_reduce(x, op=dist.ReduceOp.SUM); x /= world_size"]] \
        == ["[11, 12]"] * 3
    assert [row[2] for row in tables["all_reduce: dist.all_reduce(x, op=dist.ReduceOp.MAX)"]] \
        == ["[21, 22]"] * 3
    assert tables["gather: dist.gather(x, gather_list, dst=0)"][0][2] == "[1, 2] [11, 12] [21, 22]"
    assert [row[2] for row in tables["scatter: dist.scatter(x, scatter_list, src=0)"]] == [
        "[1, 2]", "[3, 4]", "[5, 6]"]
    assert [row[2] for row in tables[
        "reduce_scatter: dist.reduce_scatter(x, input_list, op=dist.ReduceOp.SUM)"]] == [
        "[33]", "[36]", "[39]"]
    shifted = [row[2] for row in tables[
        "send_recv: dist.batch_isend_irecv([P2POp(dist.isend, x, (rank+1) % W), "
        "P2POp(dist.irecv, y, (rank-1) % W)])"]]
    assert shifted == ["[21, 22]", "[1, 2]", "[11, 12]"]
    assert "dist.ReduceOp.AVG works on gloo" in out or "dist.ReduceOp.AVG is not supported" in out


@pytest.mark.slow
def test_collectives_without_a_launcher_is_a_world_of_one():
    result = run([PYTHON, "scripts/lesson4_collectives.py"], timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "not started by torchrun" in result.stderr
    assert "every collective is trivial" in result.stdout
    assert "send/recv needs two ranks and is skipped" in result.stdout
    assert "send_recv:" not in result.stdout
    assert "check: 12 of 12 results match the model" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_groups_on_two_simulated_nodes():
    result = launch("scripts/lesson4_groups.py", nproc=2, nnodes=2, timeout=120, capture=True,
                    echo=False, cwd=str(ROOT))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    assert "node 0 = ranks [0, 1], node 1 = ranks [2, 3]" in out
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line[:1].isdigit()]
    node_rows, parity_rows = rows[:4], rows[4:]
    # rank, node, local rank, pid, rank in node group, get_group_rank, leader, leader pid, sum
    assert [(r[0], r[1], r[2], r[4], r[5], r[6], r[8]) for r in node_rows] == [
        ("0", "0", "0", "0", "0", "0", "1"), ("1", "0", "1", "1", "1", "0", "1"),
        ("2", "1", "0", "0", "0", "2", "5"), ("3", "1", "1", "1", "1", "2", "5")]
    assert [r[7] for r in node_rows] == [node_rows[0][3]] * 2 + [node_rows[2][3]] * 2
    # rank, rank in even group, rank in odd group, parity sum
    assert parity_rows == [["0", "0", "-1", "2"], ["1", "-1", "0", "4"],
                           ["2", "1", "-1", "2"], ["3", "-1", "1", "4"]]
    assert "check: every per-node and per-parity result is right" in out
    assert "summary: world_size=4 nodes=2 node_groups=2 backend=gloo ok=True" in out


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_hang_drill_ends_at_the_timeout_and_the_fix_finishes():
    def drill(*flags):
        # the notebook's drill exactly (--timeout 2, nproc 2): one run in a test session
        return launch("scripts/lesson4_hang.py", ["--timeout", "2", *flags], nproc=2, timeout=90,
                      capture=True, echo=False, cwd=str(ROOT))

    with ThreadPoolExecutor(2) as pool:  # side by side: the broken one mostly waits
        jobs = pool.submit(drill), pool.submit(drill, "--fixed")
        broken, fixed = (job.result() for job in jobs)
    assert broken.returncode not in (0, 124), broken.stdout + broken.stderr  # failed, not killed
    assert "rank 0 waited 2 s in all_reduce: the other ranks never joined it" in broken.stdout
    assert "rank 1 waited 2 s in barrier: some rank never arrived" in broken.stdout
    waited = float(re.search(r"outcome=failed op=all_reduce waited_s=([\d.]+)",
                             broken.stdout).group(1))
    assert 2 <= waited < 10
    assert "error: the ranks did not call the same collectives" in broken.stderr

    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "step 2: mean loss 0.3833" in fixed.stdout  # (1/3 + 0) and (1/3 + 0.1), averaged
    assert "summary: world_size=2 fixed=True outcome=finished" in fixed.stdout


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_allreduce_bench_quick_run(tmp_path):
    plot = tmp_path / "bench.png"
    result = run([PYTHON, ALLREDUCE_BENCH, "--max-bytes", "4K",
                  "--world-sizes", "3", "--plot", str(plot)], timeout=140)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads((ROOT / "runs" / "lesson4_allreduce_W3.json").read_text())
    assert data["world_size"] == 3 and data["memcpy_GBps"] > 0
    rows = data["rows"]
    assert {(r["method"], r["bytes"]) for r in rows} == {
        (m, b) for m in ("all_reduce", "ring", "naive") for b in (1024, 4096)}
    for r in rows:
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 4 / 3)
    assert "busbw = algbw * 2(W-1)/W = algbw * 1.33" in result.stdout
    assert "limit: memory copy on this machine" in result.stdout
    assert "$ OMP_NUM_THREADS=" in result.stdout and "--nproc-per-node=3" in result.stdout
    assert plot.stat().st_size > 10_000
    assert result.stdout.strip().splitlines()[-1].startswith("summary: world_sizes=3 sizes=2 ")


@pytest.mark.parametrize("cmd, message", [
    ([ALLREDUCE_BENCH, "--max-bytes", "10"], "is smaller than --min-bytes"),
    ([ALLREDUCE_BENCH, "--max-bytes", "lots"], "is not a size"),
    ([ALLREDUCE_BENCH, "--world-sizes", "1"], "at least 2 processes"),
    (["scripts/lesson4_hang.py", "--timeout", "0"], "--timeout must be a positive"),
])
def test_bad_arguments_are_one_line_errors(cmd, message):
    result = run([PYTHON, *cmd], timeout=60)
    assert result.returncode == 2
    assert message in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
