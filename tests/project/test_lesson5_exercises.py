"""Lesson 5's node lists are SLURM's own: the reference agrees with `scontrol show hostnames`."""

import os
import shutil
import subprocess

import pytest
from util import ROOT

from ddpcourse.grading import load_exercises

pytestmark = pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                                reason="this copy of the course has no solutions/")

NODE_LISTS = ["gpu5", "a,b , c", "node[1-3]", "n[7]", "node[01-03,07],gpu5", "c[08-11]",
              "x[098-101,7]", "rack[1-2]-n[1-2]", "node[3,1,1],a", "gpu[07-09],cpu1"]


@pytest.mark.skipif(shutil.which("scontrol") is None,
                    reason="SLURM is not installed (apt-get install slurm-wlm)")
def test_reference_expands_node_lists_as_scontrol_does(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_IMPL", "solutions")
    reference = load_exercises(5)
    # scontrol needs a configuration to start, though expanding a list asks no daemon.
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=course\nSlurmctldHost=localhost\n")
    for nodelist in NODE_LISTS:
        shown = subprocess.run(["scontrol", "show", "hostnames", nodelist], text=True,
                               capture_output=True, timeout=20,
                               env=dict(os.environ, SLURM_CONF=str(conf)))
        assert shown.returncode == 0, shown.stderr
        assert reference.expand_nodelist(nodelist) == shown.stdout.split(), nodelist
