"""What scripts/experiments/lesson9_trainer.py shows of Lightning's Trainer is what its runs did.

The experiment runs once per test session (a module fixture; under pytest-xdist the workers
share that one run through a file lock) and every test checks the facts of its table: how each
strategy makes its ranks, where rank_zero_only runs, what sync_dist averages, the validation
set's padded duplicates, and a dataset that ddp_fork's children share with their parent.

`make test-lesson9` installs lesson 9's packages (requirements-lesson9.txt) into .venv and
runs these; without the packages they skip, saying why. On the CPU with gloo, as every test.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from ddpcourse.report import parse_summary, parse_table

for library in ("lightning", "accelerate", "deepspeed", "distributed"):
    pytest.importorskip(library, reason="lesson 9's packages are not installed "
                                        "(make test-lesson9 installs them)")

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = "scripts/experiments/lesson9_trainer.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(table rows, summary fields) of one run of the experiment."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # one folder for every xdist worker of this session
    recorded = shared / "lesson9_trainer.json"
    with FileLock(str(recorded) + ".lock"):
        if not recorded.exists():
            result = subprocess.run([sys.executable, EXPERIMENT], cwd=ROOT,
                                    capture_output=True, text=True, timeout=400)
            recorded.write_text(json.dumps([result.returncode, result.stdout, result.stderr]))
        returncode, stdout, stderr = json.loads(recorded.read_text())
    assert returncode == 0, stdout[-2000:] + stderr[-3000:]
    return parse_table(stdout), parse_summary(stdout, once=True)


def facts(cell: str) -> dict[str, str]:
    """The key=value pairs of a measured cell."""
    return dict(re.findall(r"([\w()-]+)=(\S+)", cell))


def rows_of(run, part: str) -> list[dict]:
    return [row for row in run[0] if row["part"] == part]


@pytest.mark.timeout(450)
def test_the_table_has_a_row_for_every_fact(run):
    rows, summary = run
    assert [r["part"] for r in rows] == list("aaaacbbbdde")
    assert summary["trainer_runs"] == "7"
    assert all(r["W"] == "2" for r in rows)


@pytest.mark.timeout(450)
def test_every_strategy_makes_its_ranks_from_node_rank_devices_and_local_rank(run):
    rows = {r["run"]: r for r in rows_of(run, "a")}
    # Lightning's "ddp" started by python: rank 0 is the process we started, rank 1 the
    # script run again by it, LOCAL_RANK set; no process gets RANK.
    assert rows["ddp, started by python"]["ranks"] == "0=0x2+0 (ours), 1=0x2+1 (its child)"
    assert rows["ddp, started by python"]["measured"] == (
        "env RANK=-,- NODE_RANK=0,0 LOCAL_RANK=0,1")
    for name in ("ddp_spawn", "ddp_fork"):  # both ranks children; the parent only waits
        assert rows[name]["ranks"] == "0=0x2+0 (its child), 1=0x2+1 (its child)", name
        assert rows[name]["measured"] == "env RANK=-,- NODE_RANK=-,- LOCAL_RANK=0,1", name
    # Two launches as two nodes: NODE_RANK x devices + LOCAL_RANK, each process ours.
    nodes = rows["ddp, num_nodes=2 x 1 device"]
    assert nodes["ranks"] == "0=0x1+0 (ours), 1=1x1+0 (ours)"
    assert nodes["measured"] == "env RANK=-,- NODE_RANK=0,1 LOCAL_RANK=0,0"
    seconds = {name: float(row["trainer s"]) for name, row in rows.items()}
    assert all(float(row["launch s"]) >= seconds[name] > 0 for name, row in rows.items())
    # (That a fork, which starts no interpreter, is the fastest is printed, not asserted:
    # timing on a shared machine is noise.)


@pytest.mark.timeout(450)
def test_rank_zero_only_runs_on_global_rank_0_alone(run):
    (row,) = rows_of(run, "c")
    assert row["measured"] == ("ran_on ddp=[0] ddp_spawn=[0] ddp_fork=[0] nodes=[0] "
                               "(not on node 1's LOCAL_RANK 0: global 1)")
    assert run[1]["rank_zero_only_ran_on"] == "0"


@pytest.mark.timeout(450)
def test_sync_dist_averages_the_ranks_values_and_only_sums_are_exact(run):
    per_rank, per_step, sums = rows_of(run, "b")
    accs = [float(a) for a in re.findall(r"\(acc ([\d.]+)\)", per_rank["ranks"])]
    assert re.match(r"6 \(acc [\d.]+\), 5 \(acc [\d.]+\)$", per_rank["ranks"])
    one = facts(per_rank["measured"])
    # One value per rank: the plain mean of the two, whatever their sample counts.
    assert float(one["logged"]) == pytest.approx(sum(accs) / 2, abs=1e-4)
    assert float(one["gap"]) > 0
    assert float(one["gap"]) == pytest.approx(abs(float(one["logged"]) - float(one["exact"])),
                                              abs=2e-4)
    steps = facts(per_step["measured"])
    # Per step: weighted, but the count 11 averaged over 2 as an integer becomes 5.
    assert steps["logged"] == steps["predicted"].split("=")[-1]
    assert "/int(11/2)=" in steps["predicted"] and float(steps["gap"]) > 0
    exact = facts(sums["measured"])
    assert exact["logged"] == exact["by_hand"] == exact["exact"] == one["exact"]
    assert float(exact["gap"]) == 0
    assert run[1]["sync_dist_gap"] == str(float(one["gap"]))


@pytest.mark.timeout(450)
def test_the_trainer_s_validation_sampler_counts_a_sample_twice_and_sums_do_not(run):
    padded, own = rows_of(run, "d")
    assert padded["run"] == "the Trainer's sampler (default)" and padded["ranks"] == "6, 6"
    seen = facts(padded["measured"])
    assert (seen["N"], seen["scored"], seen["duplicates"], seen["twice"]) == (
        "11", "12", "1", "[0]")  # DistributedSampler pads with the first sample
    assert seen["logged"] != seen["exact"]
    exact = facts(own["measured"])
    assert own["ranks"] == "6, 5"
    assert (exact["scored"], exact["duplicates"]) == ("11", "0")
    assert exact["logged"] == exact["exact"] == seen["exact"]
    assert run[1]["duplicates"] == "1"


@pytest.mark.timeout(450)
def test_ddp_fork_s_children_read_the_parent_s_tensor_without_a_copy(run):
    (row,) = rows_of(run, "e")
    parents = re.findall(r"pid (\d+) \(parent (\d+)\)", row["ranks"])
    shared = facts(row["measured"])
    assert len(parents) == 2 and {p for _, p in parents} == {shared["built_in"]}
    assert shared["same_address"] == "True" and shared["size"] == "32MB"
    assert shared["private"] == "0MB"  # every page still the parent's
    assert shared["after_a_1MB_write"] == "1MB"  # copy on write: the pages written, only
    assert run[1]["private_mb"] == "0"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, line", [
    (["--val-size", "4"], "lesson9_trainer.py: error: --val-size must be odd and >= 3: 2 ranks "
                          "must hold different numbers (--help lists the options)"),
    (["--timeout", "3"], "error: ddp, started by python did not finish within 3 s and was "
                         "stopped"),
])
def test_bad_input_or_a_run_out_of_time_is_one_line_and_leaves_nothing(args, line):
    result = subprocess.run([sys.executable, EXPERIMENT, *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=100)
    assert result.returncode in (1, 2) and result.stderr.splitlines()[-1] == line
    leftover = subprocess.run(["pgrep", "-f", f"{EXPERIMENT} --timeout {args[-1]} --worker"],
                              capture_output=True, text=True).stdout.split()
    assert leftover == []
