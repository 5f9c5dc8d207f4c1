"""Launching: bad input fails fast with one line; jobs never hang; ports never collide."""

import socket
import subprocess
import time

import pytest
from util import PYTHON, ROOT, run

from ddpcourse.cli import ArgumentParser
from ddpcourse.cluster.launch import AgentFailureSummary, LaunchError, launch, torchrun_commands

# make's lesson rule runs `$(VPY) -m ddpcourse.course.lessons`, whose torchrun is the one beside
# that Python: here the fork server's stand-ins, so the job's processes do not import torch anew.
MAKE_PYTHON = f"VPY={PYTHON}"


@pytest.mark.parametrize("args, message", [
    (["NPROC=0"], "NPROC=0 is out of range"),
    (["NPROC=-1"], "NPROC=-1 is out of range"),
    (["NPROC=abc"], "NPROC='abc' is not a whole number"),
    (["NNODES=0"], "NNODES=0 is out of range"),
    (["PORT=99999"], "PORT=99999 is out of range"),
    (["BACKEND=mpi"], "BACKEND='mpi' is not a backend"),
    # the tests hide any GPU (conftest.py), so this machine has none
    (["BACKEND=nccl"], "BACKEND=nccl needs NVIDIA GPUs and none is visible here"),
])
def test_bad_make_arguments_fail_before_anything_starts(args, message):
    started = time.monotonic()
    result = run(["make", "--no-print-directory", "lesson1", *args], timeout=60)
    assert result.returncode != 0
    error_lines = [line for line in result.stderr.splitlines() if not line.startswith("make")]
    assert error_lines == [f"error: {message}" + error_lines[0].split(message, 1)[1]]
    assert "torchrun" not in result.stdout  # nothing was launched
    assert time.monotonic() - started < 10


def test_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} is already in use"):
            launch("scripts/lesson1_whoami.py", nproc=1, port=port, echo=False)
        result = run([PYTHON, "-m", "ddpcourse.cluster.launch", "--port", str(port),
                      "scripts/lesson1_whoami.py"], timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: port {port} is already in use on 127.0.0.1; pick another PORT or leave it "
        "unset to get a free one"]


def test_simulated_nodes_get_one_command_each():
    commands = torchrun_commands("s.py", ["--x"], nproc=2, nnodes=2, port=1234)
    assert commands == [
        ["torchrun", "--nnodes=2", "--node-rank=0", "--nproc-per-node=2",
         "--master-addr=127.0.0.1", "--master-port=1234", "s.py", "--x"],
        ["torchrun", "--nnodes=2", "--node-rank=1", "--nproc-per-node=2",
         "--master-addr=127.0.0.1", "--master-port=1234", "s.py", "--x"],
    ]


def test_torchrun_s_report_stays_and_gets_a_one_line_summary():
    lines = []
    f = AgentFailureSummary(lines.append)
    worker = ["Traceback (most recent call last):\n", '  File "train.py", line 3\n',
              "ValueError: bad\n"]
    agent = ["Traceback (most recent call last):\n", '  File "/v/bin/torchrun", line 6\n',
             "    sys.exit(main())\n", "ChildFailedError:\n", "=" * 20 + "\n", "train.py FAILED\n",
             "Failures:\n", "  rank      : 1 (local_rank: 1)\n", "  exitcode  : 9 (pid: 8)\n",
             "Root Cause (first observed failure):\n", "  rank      : 3 (local_rank: 1)\n",
             "  exitcode  : 2 (pid: 9)\n", "=" * 20 + "\n", "after\n"]
    for line in worker + agent:
        f.feed(line)
    assert lines == worker + agent[:-1] + [
        "error: the job failed: rank 3 exited with code 2 first "
        "(the workers' own messages are above torchrun's report)\n",
        "after\n"]


def test_exit_barrier_noise_after_a_finished_job_is_explained():
    lines = []
    f = AgentFailureSummary(lines.append)
    noise = ["E1122 01:00:00 api.py:1008] Error waiting on exit barrier. Elapsed: 3 s\n",
             "Traceback (most recent call last):\n",
             '  File "/v/torch/distributed/elastic/agent/server/api.py", line 990\n',
             "torch.distributed.DistNetworkError: connection reset\n"]
    for line in ["summary: ok\n", *noise, "next\n"]:
        f.feed(line)
    assert lines[:5] == ["summary: ok\n", *noise] and lines[-1] == "next\n"
    assert lines[5].startswith("note: the traceback above comes after the job finished")


def test_torchrun_stopped_by_a_signal_says_so_in_one_line_and_other_tracebacks_stay():
    lines = []
    f = AgentFailureSummary(lines.append)
    stopped = ["W1128 12:11:36 api.py:753] Received 15 death signal, shutting down workers\n",
               "Traceback (most recent call last):\n",
               '  File "/v/bin/torchrun", line 8, in <module>\n', "    sys.exit(main())\n",
               '  File "/v/torch/distributed/elastic/multiprocessing/api.py", line 86, in '
               "_terminate_process_handler\n",
               "torch.distributed.elastic.multiprocessing.api.SignalException: Process 19928 got "
               "signal: 15\n"]
    other = ["Traceback (most recent call last):\n", '  File "train.py", line 3\n',
             "ValueError: bad\n"]
    cut = ["Traceback (most recent call last):\n", '  File "train.py", line 9\n']
    for line in stopped + other + ["next\n"] + cut:
        f.feed(line)
    assert lines == [stopped[0],
                     "note: torchrun (pid 19928) got SIGTERM and stopped its workers, passing "
                     "the signal on: that is how a stopped job ends (its traceback left out; "
                     "COURSE_RAW_TORCHRUN=1 shows it)\n", *other, "next\n"]
    f.close()  # the output ended inside a traceback: shown as it was
    assert lines[-2:] == cut


@pytest.mark.slow
def test_a_hanging_job_is_stopped_at_its_time_limit(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(600)\n")
    started = time.monotonic()
    result = launch(str(script), nproc=2, timeout=8, capture=True, echo=False)
    assert result.returncode == 124
    assert "did not finish within 8 s" in result.stderr
    assert time.monotonic() - started < 20
    leftover = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""  # workers were killed with their agent


@pytest.mark.slow
def test_a_job_is_stopped_when_its_progress_lines_stop(tmp_path):
    """progress=(prefix, s): a job that grades many submissions in turn runs as long as each
    comes within s seconds of the last (ddpcourse/course/batched_jobs.py); other output does
    not count."""
    script = tmp_path / "stalls.py"
    script.write_text("import time\n"
                      "for i in range(4):\n"
                      "    print(f'### step {i}', flush=True)\n"
                      "    time.sleep(1.5)\n"
                      "while True:\n"
                      "    print('not progress', flush=True)\n"
                      "    time.sleep(0.5)\n")
    started = time.monotonic()
    result = launch(str(script), nproc=1, timeout=60, capture=True, echo=False,
                    progress=("### ", 4))
    assert result.returncode == 124
    assert "printed no '###' line for 4 s" in result.stderr
    # the last step came after more than 4 s, and the job was stopped well before 60 s
    assert result.stdout.count("### step") == 4 and "not progress" in result.stdout
    assert time.monotonic() - started < 30


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_lesson1_jobs_at_once_odd_world_and_two_simulated_nodes():
    """NPROC=3 on one node and NNODES=2 NPROC=2 run side by side without port clashes."""
    jobs = {
        "three": ["make", "--no-print-directory", "lesson1", "NPROC=3", MAKE_PYTHON],
        "two_nodes": ["make", "--no-print-directory", "lesson1", "NNODES=2", "NPROC=2",
                      MAKE_PYTHON],
    }
    procs = {name: subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, cmd in jobs.items()}
    outputs = {name: p.communicate(timeout=200) for name, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, outputs[name]

    def table(stdout):
        rows = [line.split() for line in stdout.splitlines() if line[:1].isdigit()]
        return [(int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows]

    three, _ = outputs["three"]
    assert "$ OMP_NUM_THREADS=" in three and "--nproc-per-node=3" in three
    assert table(three) == [(0, 0, 0, 3, 3), (1, 0, 1, 3, 3), (2, 0, 2, 3, 3)]
    two, _ = outputs["two_nodes"]
    assert "--node-rank=0" in two and "--node-rank=1" in two
    assert table(two) == [(0, 0, 0, 4, 2), (1, 0, 1, 4, 2), (2, 1, 0, 4, 2), (3, 1, 1, 4, 2)]
    assert "holds for all 4 processes" in two
    assert "summary: world_size=4 nodes=2 backend=gloo" in two


@pytest.mark.slow
def test_whoami_without_torchrun_runs_as_a_world_of_one(tmp_path):
    picture = tmp_path / "job.png"
    result = run([PYTHON, "scripts/lesson1_whoami.py", "--picture", str(picture)], timeout=90)
    assert result.returncode == 0, result.stderr
    assert "not started by torchrun" in result.stderr
    assert "make lesson1 NPROC=4" in result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert [r[:5] for r in rows] == [["0", "0", "0", "1", "1"]]
    assert picture.stat().st_size > 5000


def test_simulated_nodes_on_a_gpu_machine_get_their_own_gpus(tmp_path, monkeypatch, capsys):
    """Two simulated nodes x 2 processes on a 4-GPU box: node 0 sees GPUs 0,1 and node 1 2,3."""
    import ddpcourse.cluster.launch as launcher

    fake_torchrun = tmp_path / "torchrun"
    fake_torchrun.write_text('#!/bin/sh\necho "$2 CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"\n')
    fake_torchrun.chmod(0o755)
    monkeypatch.setattr(launcher, "visible_gpu_count", lambda environ=None: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = launch("s.py", nproc=2, nnodes=2, timeout=30, capture=True,
                    torchrun=str(fake_torchrun))
    assert sorted(result.stdout.splitlines()) == [
        "--node-rank=0 CUDA_VISIBLE_DEVICES=0,1", "--node-rank=1 CUDA_VISIBLE_DEVICES=2,3"]
    assert "CUDA_VISIBLE_DEVICES=2,3 " in capsys.readouterr().out  # the echoed command says so
    with pytest.raises(LaunchError, match="NPROC=3 x NNODES=2 processes but this machine has 4"):
        launch("s.py", nproc=3, nnodes=2, torchrun=str(fake_torchrun))
    # BACKEND=gloo: the CPU, whatever the GPUs, so any number of processes
    result = launch("s.py", nproc=3, nnodes=2, timeout=30, capture=True, backend="gloo",
                    torchrun=str(fake_torchrun))
    assert sorted(result.stdout.splitlines()) == [
        "--node-rank=0 CUDA_VISIBLE_DEVICES=", "--node-rank=1 CUDA_VISIBLE_DEVICES="]


@pytest.mark.parametrize("rank", [None, "0", "2"])
def test_a_bad_option_is_one_line_and_other_ranks_leave_it_to_rank_0(rank, monkeypatch, capsys):
    import ddpcourse.cli

    if rank is None:
        monkeypatch.delenv("RANK", raising=False)  # plain python: a world of one
    else:
        monkeypatch.setenv("RANK", rank)
    waits = []
    monkeypatch.setattr(ddpcourse.cli.time, "sleep", waits.append)
    parser = ArgumentParser(prog="train.py")
    parser.add_argument("--epochs", type=int, default=1)
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(["--epochs", "x"])
    assert stopped.value.code == 2
    printed = capsys.readouterr()
    assert printed.out == ""
    # rank 2 waits for rank 0 to speak; if it is still alive afterwards it speaks itself
    who = "error (rank 2):" if rank == "2" else "error:"
    assert printed.err == f"train.py: {who} argument --epochs: invalid int value: 'x' " \
                          "(--help lists the options)\n"
    assert waits == ([ddpcourse.cli.WAIT_FOR_RANK_0_S] if rank == "2" else [])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_bad_option_under_torchrun_is_reported_once():
    result = run(["make", "--no-print-directory", "lesson1", "NPROC=3", "ARGS=--bogus",
                  MAKE_PYTHON], timeout=100)
    assert result.returncode != 0
    printed = result.stdout + result.stderr
    assert printed.count("error: unrecognized arguments: --bogus") == 1, printed
    assert "usage:" not in printed and "(rank " not in printed
    assert "rank 0 exited with code 2 first" in printed  # the others were waiting for it
