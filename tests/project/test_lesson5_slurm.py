"""Lesson 5: SLURM, tested against a real one (ddpcourse.cluster.slurm on the course's hosts).

Without root or SLURM: the batch scripts with a stand-in srun and scontrol (the exact torchrun
and srun commands they build), the cluster's configuration, and the one-line errors. With
them: one cluster runs both batch scripts for real (torchrun on 2 nodes; srun starting 2 x 2
processes) and a job that runs out of time, while a second cluster, from the command line,
runs a job that fails; then nothing may be left: no namespace, folder or process. Ctrl-C and
a cluster that cannot start leave nothing either.

The tests that start daemons need root, `ip`, and the packages slurm-wlm and munge (apt-get
install slurm-wlm munge); elsewhere they are skipped, saying why.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest
from util import PYTHON, REAL_PYTHON, ROOT, machine_load, run

from ddpcourse.cluster import hosts as H
from ddpcourse.cluster import slurm as S

REASON = S.unavailable_reason()
needs_slurm = pytest.mark.skipif(REASON is not None, reason=f"no SLURM cluster here: {REASON}")
TORCHRUN_SBATCH, SRUN_SBATCH = "scripts/lesson5_slurm.sbatch", "scripts/lesson5_slurm_srun.sbatch"
WHOAMI = "scripts/experiments/lesson5_slurm_whoami.py"


def leftovers(pid: int) -> set[str]:
    """Namespaces, /etc/netns entries and cluster folders made by process `pid`."""
    if H.unavailable_reason() is not None:
        return set()
    etc = set(os.listdir(H.NETNS_ETC)) if os.path.isdir(H.NETNS_ETC) else set()
    found = {name for name in set(H.list_namespaces()) | etc
             if name.startswith(f"{H.NAME_PREFIX}{pid}-")}
    top = tempfile.gettempdir()
    return found | {os.path.join(top, name) for name in os.listdir(top)
                    if name.startswith(f"{H.NAME_PREFIX}{pid}-")}


def alive(pids) -> list[int]:
    """The pids among `pids` still running (a zombie waiting for its parent counts as ended)."""
    running = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    running.append(pid)
        except FileNotFoundError:
            pass
    return running


def processes_in(names: list[str]) -> list[int]:
    return [pid for name in names for pid in H.pids_in(name)]


# The batch scripts, with stand-ins: no SLURM needed -------------------------------------------

FAKE_SRUN = """#!/bin/sh
echo "MASTER_ADDR=${MASTER_ADDR:-} MASTER_PORT=${MASTER_PORT:-}"
echo "SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK:-} OMP_NUM_THREADS=${OMP_NUM_THREADS:-}"
echo "srun $*"
"""
FAKE_SCONTROL = """#!/bin/sh
[ "$1 $2 $3" = "show hostnames node[07-08]" ] && printf 'node07\\nnode08\\n'
"""


def run_batch_script(tmp_path, script, args=(), **env) -> list[str]:
    """Run a batch script as a job's first node would, srun and scontrol being stand-ins."""
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    job = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node[07-08]",
           "SLURM_NNODES": "2", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "42", **env}
    result = subprocess.run(["bash", script, *args], cwd=ROOT, env=job, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def sbatch_options(script) -> list[str]:
    text = (ROOT / script).read_text()
    return [line.split()[1] for line in text.splitlines() if line.startswith("#SBATCH")]


def test_the_torchrun_batch_script_starts_one_torchrun_per_node_meeting_on_the_first(tmp_path):
    # one task per node, torchrun, with CPUs for all its processes
    assert sbatch_options(TORCHRUN_SBATCH)[1:4] == ["--nodes=2", "--ntasks-per-node=1",
                                                    "--cpus-per-task=8"]
    lines = run_batch_script(tmp_path, TORCHRUN_SBATCH, NPROC="3", SLURM_CPUS_PER_TASK="8")
    assert lines[0] == "job 42: nodes node07 node08, 3 process(es) each; rendezvous on node07:29500"
    # srun does not inherit sbatch's --cpus-per-task: handed on, and shared out as threads
    assert lines[1] == "8 CPU(s) per torchrun and its processes, 2 thread(s) each"
    assert "SRUN_CPUS_PER_TASK=8 OMP_NUM_THREADS=2" in lines
    assert lines[-1] == ("srun .venv/bin/torchrun --nnodes=2 --nproc-per-node=3 "
                         "--rdzv-backend=c10d --rdzv-endpoint=node07:29500 --rdzv-id=42 "
                         "scripts/lesson1_whoami.py")
    # one process per GPU SLURM gave the node, the course's Python from COURSE_VENV, a script
    lines = run_batch_script(tmp_path, TORCHRUN_SBATCH, ["scripts/lesson3_ddp.py", "--epochs",
                             "2"], SLURM_GPUS_ON_NODE="4", COURSE_VENV="/opt/venv", PORT="2345")
    assert lines[-1] == ("srun /opt/venv/bin/torchrun --nnodes=2 --nproc-per-node=4 "
                         "--rdzv-backend=c10d --rdzv-endpoint=node07:2345 --rdzv-id=42 "
                         "scripts/lesson3_ddp.py --epochs 2")


def test_the_srun_batch_script_starts_every_process_with_master_addr_set(tmp_path):
    assert sbatch_options(SRUN_SBATCH)[1:4] == ["--nodes=2", "--ntasks-per-node=2",
                                                "--cpus-per-task=4"]
    lines = run_batch_script(tmp_path, SRUN_SBATCH, SLURM_CPUS_PER_TASK="4")
    assert lines == [
        "job 42: nodes node07 node08, 4 processes; rank 0's store on node07:29500",
        "MASTER_ADDR=node07 MASTER_PORT=29500",
        "SRUN_CPUS_PER_TASK=4 OMP_NUM_THREADS=4",  # each process's CPUs, used as threads
        f"srun --kill-on-bad-exit=1 .venv/bin/python {WHOAMI}"]


# The configuration and the command line, without starting anything ---------------------------

def test_the_configuration_keeps_every_file_in_the_run_folder_and_uses_munge():
    conf = S.slurm_conf("/tmp/RUN", 3, "/tmp/RUN/munge/munge.socket")
    settings = [line.split("=", 1) for line in conf.splitlines()
                if line and not line.startswith("#")]
    single = {key: value for key, value in settings if key not in ("NodeName", "PartitionName")}
    assert single["SlurmctldHost"] == "host0(10.213.0.1)"
    assert (single["AuthType"], single["AuthInfo"]) == ("auth/munge",
                                                         "socket=/tmp/RUN/munge/munge.socket")
    assert (single["ProctrackType"], single["TaskPlugin"]) == ("proctrack/linuxproc", "task/none")
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile",
                "SlurmctldPidFile", "PlugStackConfig"):
        assert single[key].startswith("/tmp/RUN/"), key
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    assert [value for key, value in settings if key == "NodeName"] == [
        f"host{k} NodeAddr=10.213.0.{k + 1} CPUs={S.CPUS_PER_NODE} RealMemory={memory_mb} "
        "State=UNKNOWN" for k in range(3)]


def test_run_splits_our_options_from_sbatch_options_and_the_script():
    assert S.split_run_args(["--hosts", "3", "--ntasks-per-node=2", "--nproc=2", "job.sbatch",
                             "whoami.py", "--timeout", "5"]) == (
        ["--hosts", "3", "--nproc=2"], ["--ntasks-per-node=2"],
        ["job.sbatch", "whoami.py", "--timeout", "5"])


@pytest.mark.parametrize("args, message", [
    (["--hosts", "0", TORCHRUN_SBATCH], "error: HOSTS=0 is out of range"),
    (["--nproc", "x", TORCHRUN_SBATCH], "error: NPROC='x' is not a whole number"),
    (["missing.sbatch"], "error: batch script missing.sbatch does not exist"),
    ([], "usage: python -m ddpcourse.cluster.slurm run"),
])
def test_bad_input_is_reported_before_anything_is_made(args, message):
    result = run([PYTHON, "-m", "ddpcourse.cluster.slurm", "run", *args], timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith(message), result.stderr
    assert result.stderr.count("error") == 1


def test_without_slurm_or_root_it_says_what_to_do(monkeypatch, capsys, tmp_path):
    if H.unavailable_reason() is None:  # a machine that can make hosts but lacks SLURM
        os.symlink(H.shutil.which("ip"), tmp_path / "ip")
        monkeypatch.setenv("PATH", str(tmp_path))
        monkeypatch.setattr(S, "SBIN", ())
        assert S.main(["run", TORCHRUN_SBATCH]) == 2
        assert capsys.readouterr().err.splitlines() == [
            "error: SLURM on the course's hosts needs munged, slurmctld, slurmd, sbatch, srun, "
            "scontrol, sinfo, scancel: install slurm-wlm and munge (apt-get install slurm-wlm "
            "munge)"]
    if os.geteuid() == 0 and H.shutil.which("setpriv"):  # really without the capability
        # As in test_lesson5_hosts.py: root without CAP_SYS_ADMIN, still able to read the
        # clone wherever it sits, on the real interpreter.
        result = run(["setpriv", "--bounding-set=-all,+dac_override,+dac_read_search",
                      "--inh-caps=-all", REAL_PYTHON,
                      "-m", "ddpcourse.cluster.slurm", "run", TORCHRUN_SBATCH], timeout=30)
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            "error: separate hosts are Linux network namespaces, and creating them needs root "
            f"(CAP_SYS_ADMIN), which this process does not have; {H.FALLBACK}"]


# A real cluster ---------------------------------------------------------------------------------

TRIVIAL = """#!/bin/bash
#SBATCH --ntasks-per-node=1
echo "batch script on $(hostname)"
srun sh -c 'echo "task $SLURM_PROCID on $(hostname) $(ip -o -4 addr show dev eth0 | \
awk "{print \\$4}")"' | sort
exit 3
"""


def table(output: str) -> list[dict]:
    """The rows rank 0 of lesson5_slurm_whoami.py printed."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("rank  node"))
    keys = ["rank", "node", "local_rank", "world_size", "host", "address", "launcher", "pid"]
    rows = []
    for line in lines[start + 2:]:
        if line.startswith("check:"):
            break
        rows.append(dict(zip(keys, line.split(), strict=True)))
    return rows


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """One cluster, three jobs, then down; meanwhile a second cluster from the command line.

    What each test checks is recorded here: outputs, timings, and what was running."""
    if REASON is not None:
        pytest.skip(f"no SLURM cluster here: {REASON}")
    trivial = tmp_path_factory.mktemp("slurm") / "trivial.sbatch"
    trivial.write_text(TRIVIAL)
    seen = SimpleNamespace(timings={})
    started = time.monotonic()
    with S.Cluster(2) as cluster:
        seen.timings["cluster start"] = cluster.start_seconds
        seen.names = [*cluster.hosts.names, cluster.hosts.switch]
        seen.folder = cluster.folder
        # the second cluster, while this one is up: the same addresses, ports and node names
        cli = subprocess.Popen([PYTHON, "-m", "ddpcourse.cluster.slurm", "run", "--hosts", "3",
                                "--timeout", "60", str(trivial)], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            # and a job that runs out of time, beside the first torch job (the nodes have room)
            late = trivial.parent / "late.sbatch"
            late.write_text("#!/bin/sh\necho started\nsleep 60\n")
            beside = threading.Thread(target=lambda: setattr(
                seen, "late", cluster.sbatch(str(late), timeout=8)))  # time to start, loaded
            beside.start()
            env = {"NPROC": "1", "OMP_NUM_THREADS": "1"}
            seen.torchrun = cluster.sbatch(TORCHRUN_SBATCH, [WHOAMI], extra_env=env, timeout=120,
                                           cwd=str(ROOT))
            seen.pids = processes_in(seen.names)  # the daemons, at least
            beside.join(timeout=60)
            seen.queue = cluster.run(["squeue", "--noheader", "--format=%i %T"]).stdout
            seen.srun = cluster.sbatch(SRUN_SBATCH, [], extra_env=env, timeout=120, cwd=str(ROOT))
            seen.refused = cluster.sbatch(str(trivial), options=["--ntasks-per-node=100"],
                                          timeout=30)
            seen.cli_stdout, seen.cli_stderr = cli.communicate(timeout=90)
        finally:  # whatever happened, the second cluster goes too
            if cli.poll() is None:
                cli.terminate()
                cli.wait(timeout=30)
        seen.cli_status, seen.cli_pid = cli.returncode, cli.pid
        seen.pids += processes_in(seen.names)
        down = time.monotonic()
    seen.timings["teardown"] = time.monotonic() - down
    seen.timings["whole"] = time.monotonic() - started
    seen.timings["torchrun job"] = seen.torchrun.seconds
    seen.timings["srun job"] = seen.srun.seconds
    print("\nSLURM test timings (s): " + ", ".join(f"{key} {value:.1f}"
                                                   for key, value in seen.timings.items()))
    return seen


def check_identities(job: S.Job, per_node: int, launcher: str) -> None:
    assert job.returncode == 0, job.output + job.sbatch_output
    rows = table(job.output)
    world = 2 * per_node
    assert sorted(int(r["rank"]) for r in rows) == list(range(world))  # every rank, once
    for r in rows:
        node, local = int(r["node"]), int(r["local_rank"])
        assert int(r["rank"]) == node * per_node + local
        assert 0 <= local < per_node and r["world_size"] == str(world)
        # ran on the host of its node rank: its hostname, its address
        assert (r["host"], r["address"], r["launcher"]) == (f"host{node}", f"10.213.0.{node + 1}",
                                                          launcher)
    assert f"world_size={world} nodes=2 per_node={per_node},{per_node} hosts=2" in job.output


@needs_slurm
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_torchrun_under_srun_runs_one_agent_per_node_on_separate_hosts(jobs):
    assert jobs.torchrun.output.startswith(f"job {jobs.torchrun.job_id}: nodes host0 host1, 1 "
                                           "process(es) each; rendezvous on host0:29500\n")
    check_identities(jobs.torchrun, per_node=1, launcher="torchrun")


@needs_slurm
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_srun_starts_every_process_and_env_init_joins_them(jobs):
    assert jobs.srun.output.startswith(f"job {jobs.srun.job_id}: nodes host0 host1, 4 processes; "
                                       "rank 0's store on host0:29500\n")
    check_identities(jobs.srun, per_node=2, launcher="srun")


@needs_slurm
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_job_out_of_time_is_stopped_with_status_124(jobs):
    assert jobs.late.returncode == 124 and jobs.late.output.startswith("started\n")
    assert f"{jobs.late.job_id} RUNNING" not in jobs.queue  # cancelled, not left running


@needs_slurm
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_job_that_cannot_fit_is_refused_at_once_not_queued(jobs):
    assert (jobs.refused.returncode, jobs.refused.job_id) == (1, None)
    assert "More processors requested than permitted" in jobs.refused.sbatch_output


@needs_slurm
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_command_line_runs_a_second_cluster_at_once_and_exits_with_the_jobs_status(jobs):
    assert jobs.cli_status == 3, jobs.cli_stdout + jobs.cli_stderr
    out = jobs.cli_stdout
    assert "slurmd on host0, host1, host2 (all idle after" in out
    assert re.search(r"^\$ SLURM_CONF=\S+/slurm.conf CUDA_VISIBLE_DEVICES='' "
                     r"(OMP_NUM_THREADS=\d+ )?ip netns exec ddpc\d+-0-h0 "
                     r"(\S*stdbuf -oL )?\S*sbatch --wait --nodes=3 --output=\S+ \S+trivial.sbatch$",
                     out, re.M), out
    assert re.search(r"^Submitted batch job 1$", out, re.M)
    job = out[out.index("batch script on"):]
    assert job.splitlines()[:5] == [
        "batch script on host0",
        "task 0 on host0 10.213.0.1/24", "task 1 on host1 10.213.0.2/24",
        "task 2 on host2 10.213.0.3/24",
        "job 1 ended with exit status 3 after " + job.splitlines()[4].split(" after ")[1]]


@needs_slurm
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_nothing_is_left_behind(jobs):
    assert jobs.pids and not alive(jobs.pids)  # daemons, jobs' processes: all stopped
    assert not set(jobs.names) & set(H.list_namespaces())
    assert not os.path.exists(jobs.folder)
    assert leftovers(os.getpid()) == set() and leftovers(jobs.cli_pid) == set()


# Leaving nothing behind, also when interrupted or failing --------------------------------------

@needs_slurm
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ctrl_c_while_a_job_runs_removes_the_cluster(tmp_path):
    script = tmp_path / "long.sbatch"
    script.write_text("#!/bin/sh\necho started\nsleep 60\n")
    # SIGINT as a terminal would deliver it: a test run started in the background by a
    # shell inherits SIGINT ignored, and so would this child.
    # The real interpreter (tests/project/conftest.py), not the fork server's stand-in: a
    # fork of the server keeps the server's SIGINT, ignored when the suite was started in the
    # background, whatever preexec_fn sets in the stand-in.
    real_python = os.environ.get("COURSE_REAL_PYTHON", sys.executable)
    child = subprocess.Popen([real_python, "-m", "ddpcourse.cluster.slurm", "run", str(script)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONFAULTHANDLER="1"),
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    while not lines or lines[-1] != "started\n":
        lines.append(child.stdout.readline())
        assert lines[-1], child.stderr.read()
    names = [name for name in H.list_namespaces() if name.startswith(f"ddpc{child.pid}-")]
    pids = processes_in(names)
    assert len(names) == 3 and len(pids) >= 5  # munged, slurmctld, 2 slurmd, the job
    child.send_signal(signal.SIGINT)
    try:  # seconds on a quiet machine; the cleanup's own waits add up to a minute under load
        status = child.wait(timeout=150)
    except subprocess.TimeoutExpired:  # show where it hangs: faulthandler prints the stacks
        child.send_signal(signal.SIGABRT)
        child.wait(timeout=10)
        S.cleanup_stale()  # what the aborted run left
        pytest.fail(f"no exit 150 s after Ctrl-C ({machine_load()}):\n" + child.stderr.read())
    assert status == 130, child.stderr.read()
    assert not alive(pids)
    assert leftovers(child.pid) == set()


@needs_slurm
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_cluster_that_cannot_start_says_why_in_one_line_and_leaves_nothing(monkeypatch):
    conf = S.slurm_conf
    monkeypatch.setattr(S, "slurm_conf",
                        lambda *a, **kw: conf(*a, **kw) + "SelectType=select/nonesuch\n")
    cluster = S.Cluster(1)
    with pytest.raises(S.SlurmError) as raised:
        with cluster:
            pass
    assert str(raised.value) == (
        "slurmctld on host0 stopped (exit status 1) while the cluster started; it said: "
        "slurmctld: fatal: Can't find plugin for select/nonesuch")
    assert not os.path.exists(cluster.folder)
    assert leftovers(os.getpid()) == set()
