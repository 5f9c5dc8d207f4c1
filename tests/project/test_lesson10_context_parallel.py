"""What torch's own context_parallel (a prototype) does on the CPU with gloo at W = 2, as
lessons/lesson10/context_parallel.md quotes it from
scripts/experiments/lesson10_context_parallel.py.

These tests pin torch 2.14.1's behaviour, whatever it is: a torch that changes it (a CPU
handler for context-parallel attention, a ring where there was an all-gather) fails them, and
the reading's paragraph is due for a new run. The job is launched once and checked several ways.
"""

import pytest
from util import ROOT, summary

from ddpcourse.cluster.launch import launch
from ddpcourse.report import parse_table

pytestmark = pytest.mark.lesson10

SCRIPT = "scripts/experiments/lesson10_context_parallel.py"
WORLD = 2
TOLERANCE = 1e-5
CASES = ["causal forward", "full forward", "full forward+backward", "causal forward+backward"]
NO_CPU_STRATEGY = ("NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu"
                   "{}.default does not have a sharding strategy registered.")


@pytest.fixture(scope="module")
def job():
    result = launch(SCRIPT, [], nproc=WORLD, timeout=280, capture=True, echo=False,
                    backend="gloo", cwd=str(ROOT))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def rows(job):
    return parse_table(job)


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_every_case_runs_under_both_rotate_methods_allgather_the_default(job, rows):
    assert [(row["rotate method"], row["case"]) for row in rows] == (
        [("allgather (default)", case) for case in CASES]
        + [("alltoall", case) for case in CASES]), job
    assert ("rotate method before any set_rotate_method: _cp_options.rotate_method = "
            "allgather;") in job
    facts = summary(job)
    assert (facts["world_size"], facts["backend"], facts["default_rotate"]) == (
        str(WORLD), "gloo", "allgather"), facts


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_the_buffers_are_cut_head_and_tail(job):
    # 120 positions in 2W = 4 chunks of 30: rank r keeps chunks r and 2W - 1 - r
    assert "positions each rank held: rank 0: 0-29,90-119; rank 1: 30-89\n" in job, job


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_causal_attention_has_no_sharding_on_the_cpu(rows):
    for row in rows:
        if row["case"].startswith("causal"):  # forward already: backward is never reached
            assert row["outcome"] == NO_CPU_STRATEGY.format(""), row
            assert row["collectives, rank 0"] == "none", row


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_full_forward_equals_one_process_by_gathering_k_and_v_whole(rows, job):
    for row in rows:
        if row["case"] == "full forward":
            assert row["outcome"].startswith("ok, max |difference| "), row
            assert float(row["outcome"].split()[-1]) <= TOLERANCE, row
            # K and V gathered whole, under alltoall too: torch's ring (all_to_all) not reached
            assert row["collectives, rank 0"] == "all_gather_into_tensor x2", row
    assert float(summary(job)["max_diff"]) <= TOLERANCE


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_full_backward_has_no_sharding_on_the_cpu(rows):
    for row in rows:
        if row["case"] == "full forward+backward":
            assert row["outcome"] == NO_CPU_STRATEGY.format("_backward"), row
            assert row["collectives, rank 0"] == "all_gather_into_tensor x2", row  # forward's


@pytest.mark.slow
@pytest.mark.timeout(320)
def test_the_summary_says_each_case_s_outcome(job):
    facts = summary(job)
    for method in ("allgather", "alltoall"):
        assert {case: facts[f"{method}_{case}"] for case in (
            "causal_fwd", "full_fwd", "full_fwd_bwd", "causal_fwd_bwd")} == {
            "causal_fwd": "NotImplementedError", "full_fwd": "ok",
            "full_fwd_bwd": "NotImplementedError", "causal_fwd_bwd": "NotImplementedError"}, facts
