"""Lesson 5's node lists are SLURM's own: every list the grading expands expands as
`scontrol show hostnames` expands it, except text after the last bracket, which the course adds
and SLURM refuses; the reference agrees with both."""

import os
import shutil
import subprocess

import pytest
from util import ROOT, grading_tests

from ddpcourse.exercises import load_exercises

pytestmark = pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                                reason="this copy of the course has no solutions/")


@pytest.mark.skipif(shutil.which("scontrol") is None,
                    reason="SLURM is not installed (apt-get install slurm-wlm)")
def test_graded_node_lists_expand_as_scontrol_expands_them(tmp_path, monkeypatch):
    grading = grading_tests(5)
    monkeypatch.setenv("COURSE_IMPL", "solutions")
    reference = load_exercises(5)
    # scontrol needs a configuration to start, though expanding a list asks no daemon.
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=course\nSlurmctldHost=localhost\n")
    problems = []
    for nodelist, hosts in grading.NODE_LISTS.items():
        shown = subprocess.run(["scontrol", "show", "hostnames", nodelist], text=True,
                               capture_output=True, timeout=20,
                               env=dict(os.environ, SLURM_CONF=str(conf)))
        said = (shown.stdout + shown.stderr).strip()
        if nodelist in grading.SLURM_REFUSES:
            if "Invalid hostlist" not in said:
                problems.append(f"{nodelist!r}: scontrol did not refuse it: {said}")
        elif shown.stdout.splitlines() != hosts:
            problems.append(f"{nodelist!r}: the grading wants {hosts}, scontrol says {said}")
        if reference.expand_nodelist(nodelist) != hosts:
            problems.append(f"{nodelist!r}: the reference gives "
                            f"{reference.expand_nodelist(nodelist)}, the grading wants {hosts}")
    assert not problems, "\n".join(problems)
