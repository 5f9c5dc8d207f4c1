"""Grading tests for lesson 5. The node lists below were checked against SLURM's own
`scontrol show hostnames` (tests/project/test_lesson5_exercises.py repeats that check wherever
SLURM is installed); the devices are checked in a real two-node job as well."""

import os
import subprocess

import pytest
from jobs import Job, run_job

from ddpcourse.grading import load_exercises

# world size -> its job: two simulated nodes of two processes
JOBS = {4: Job("lesson5_W4", "lesson5_devices.py", nproc=2, nnodes=2, timeout=120)}


@pytest.fixture(scope="module")
def ex():
    return load_exercises(5)


@pytest.fixture
def no_scontrol(monkeypatch):
    """expand_nodelist must do the expanding, not ask SLURM's `scontrol show hostnames`."""
    def refuse(*args, **kwargs):
        raise AssertionError("expand_nodelist asked another program (scontrol?): expand the "
                             "list yourself")
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "system", refuse)


# --- l5_expand_nodelist ------------------------------------------------------------------

@pytest.mark.l5_expand_nodelist
@pytest.mark.usefixtures("no_scontrol")
@pytest.mark.points(1)
def test_plain_names_and_simple_ranges(ex):
    assert ex.expand_nodelist("gpu5") == ["gpu5"]
    assert ex.expand_nodelist("a,b , c") == ["a", "b", "c"]
    assert ex.expand_nodelist("node[1-3]") == ["node1", "node2", "node3"]
    assert ex.expand_nodelist("n[7]") == ["n7"]


@pytest.mark.l5_expand_nodelist
@pytest.mark.usefixtures("no_scontrol")
@pytest.mark.points(2)
def test_lists_inside_brackets_keep_their_padding(ex):
    assert ex.expand_nodelist("node[01-03,07],gpu5") == [
        "node01", "node02", "node03", "node07", "gpu5"]
    assert ex.expand_nodelist("c[08-11]") == ["c08", "c09", "c10", "c11"]
    assert ex.expand_nodelist("x[098-101,7]") == ["x098", "x099", "x100", "x101", "x7"]


@pytest.mark.l5_expand_nodelist
@pytest.mark.usefixtures("no_scontrol")
@pytest.mark.points(1)
def test_several_brackets_and_the_order_slurm_keeps(ex):
    assert ex.expand_nodelist("rack[1-2]-n[1-2]") == [
        "rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    assert ex.expand_nodelist("node[3,1,1],a") == ["node3", "node1", "node1", "a"]


@pytest.mark.l5_expand_nodelist
@pytest.mark.usefixtures("no_scontrol")
@pytest.mark.points(1)
def test_malformed_node_lists_are_refused(ex):
    for bad in ["", "  ", "a,,b", "a[1", "a]1", "a[]", "a[3-1]", "a[x]", "a[[1]]", "a[1-]"]:
        with pytest.raises(ValueError):
            ex.expand_nodelist(bad)


# --- l5_slurm_identity -------------------------------------------------------------------

@pytest.mark.l5_slurm_identity
@pytest.mark.points(2)
def test_tasks_per_node_with_repeats(ex):
    assert [ex.tasks_on_node("2(x3),1", n) for n in range(4)] == [2, 2, 2, 1]
    assert ex.tasks_on_node("4", 0) == 4
    assert [ex.tasks_on_node("1,3(x2)", n) for n in range(3)] == [1, 3, 3]
    for text, node in [("2(x3),1", 4), ("2(x3),1", -1), ("two", 0), ("2(3)", 0)]:
        with pytest.raises(ValueError):
            ex.tasks_on_node(text, node)


# srun's variables for the process with global rank 5 of a job on four nodes that run
# 2, 2, 2 and 1 tasks: it is the second task (local rank 1) of the third node.
SRUN = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "7", "SLURM_NODEID": "2",
        "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_JOB_NODELIST": "gpu[07-09],cpu1",
        "SLURM_NNODES": "4", "SLURMD_NODENAME": "gpu09", "SLURM_NTASKS_PER_NODE": "2"}


@pytest.mark.l5_slurm_identity
@pytest.mark.points(4)
def test_identity_of_a_process_srun_started(ex):
    assert ex.identity_from_slurm(SRUN) == {
        "rank": 5, "local_rank": 1, "world_size": 7, "local_world_size": 2, "node_rank": 2,
        "master_addr": "gpu07"}
    last = dict(SRUN, SLURM_PROCID="6", SLURM_LOCALID="0", SLURM_NODEID="3",
                SLURMD_NODENAME="cpu1")
    assert ex.identity_from_slurm(last)["local_world_size"] == 1  # the node with one task
    assert ex.identity_from_slurm(last)["master_addr"] == "gpu07"


@pytest.mark.l5_slurm_identity
@pytest.mark.points(1)
def test_identity_outside_srun_names_what_is_missing(ex):
    with pytest.raises(RuntimeError, match="SLURM_PROCID"):
        ex.identity_from_slurm({"HOME": "/home/student"})
    partial = {k: v for k, v in SRUN.items() if k != "SLURM_TASKS_PER_NODE"}
    with pytest.raises(RuntimeError, match="SLURM_TASKS_PER_NODE"):
        ex.identity_from_slurm(partial)


# --- l5_process_devices ------------------------------------------------------------------

@pytest.mark.l5_process_devices
@pytest.mark.points(2)
def test_devices_of_each_process(ex):
    assert ex.process_devices(0, 4, 2) == [0, 1]
    assert ex.process_devices(1, 4, 2) == [2, 3]
    assert ex.process_devices(3, 8, 2) == [6, 7]
    assert ex.process_devices(1, 8, 4) == [4, 5, 6, 7]
    assert ex.process_devices(5, 6, 1) == [5]
    for args in [(2, 4, 2), (-1, 4, 2), (0, 4, 3), (0, 4, 0), (0, 4, 8)]:
        with pytest.raises(ValueError):
            ex.process_devices(*args)


@pytest.mark.l5_process_devices
@pytest.mark.points(3)
def test_devices_in_a_job_of_two_nodes(ex):
    """Two simulated nodes of 2 processes, 4 GPUs each: on each node local ranks 0 and 1 own
    GPUs 0-1 and 2-3, whatever their global rank."""
    ex.my_devices({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "RANK": "0",
                   "WORLD_SIZE": "4", "GROUP_RANK": "0"}, 4)  # fail fast, before a launch
    result = run_job(JOBS[4])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("devices: ")]
    assert lines == ["devices: ok on 4 ranks"], result.stdout[-3000:]
