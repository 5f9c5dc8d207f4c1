"""Lesson 5: what torchrun hands each process under a static launch and under c10d
rendezvous; the same world joined with env://, tcp:// and file://; the failure drills, each
ending in seconds with the line a student needs; per-rank logs and @record's error file; the
step, lesson 3's DDP with the model split over each process's devices, ending with lesson 3's
weights bit for bit.

Every job is launched once (module-scoped fixtures) and checked many ways. The drills run
once, four at a time, with 5-second timeouts. Those that need separate hosts (network
namespaces, root) say they were skipped where hosts cannot be made.
"""

import json
import re
from pathlib import Path

import pytest
from util import PYTHON, ROOT, run, summary

from ddpcourse.cluster import hosts as H
from ddpcourse.cluster.launch import AgentFailureSummary, launch, torchrun_commands
from ddpcourse.ports import free_port
from ddpcourse.report import parse_table

HOSTS_REASON = H.unavailable_reason()


def shared(stdout: str) -> dict[str, str]:
    """The variables lesson5_env.py lists once, as the same in every process."""
    return dict(re.findall(r"^  ([A-Z_]+)\s+(\S+)", stdout, re.M))


# --- the launcher: c10d rendezvous and the failure line (no processes) ----------------------

def test_c10d_commands_are_the_same_on_every_node_with_no_node_rank():
    commands = torchrun_commands("s.py", ["--x"], nproc=2, nnodes=2, port=1234, rdzv="c10d")
    assert commands == [["torchrun", "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                         "--rdzv-endpoint=127.0.0.1:1234", "--rdzv-id=job1234", "s.py",
                         "--x"]] * 2


def test_an_unknown_rendezvous_is_one_line():
    result = run([PYTHON, "-m", "ddpcourse.cluster.launch", "--check", "--rdzv", "etcd"],
                 timeout=30)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: RDZV='etcd' is not a rendezvous the course launches; use static (--node-rank, "
        "--master-addr, --master-port) or c10d"]
    result = run([PYTHON, "-m", "ddpcourse.cluster.launch", "--check"], timeout=30,
                 env={"RDZV": "x"})
    assert result.returncode == 2 and "RDZV='x'" in result.stderr  # make passes RDZV=...


def report_lines(error_file: str) -> list[str]:
    return ["Traceback (most recent call last):\n", '  File "/v/bin/torchrun", line 6\n',
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
            "=" * 20 + "\n", "train.py FAILED\n", "Root Cause (first observed failure):\n",
            "[0]:\n", "  host      : node7\n", "  rank      : 5 (local_rank: 1)\n",
            "  exitcode  : 1 (pid: 9)\n", f"  error_file: {error_file}\n",
            "  traceback : Traceback (most recent call last):\n",
            '    File "train.py", line 3, in main\n', "  ValueError: from the traceback\n",
            "  \n", "=" * 20 + "\n"]


def test_the_failure_line_names_the_host_and_the_exception_of_the_error_file(tmp_path):
    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": {
        "message": "ValueError: bad\nbatch", "extraInfo": {"py_callstack": "...",
                                                          "timestamp": "1"}}}))
    lines = []
    f = AgentFailureSummary(lines.append)
    for line in report_lines(str(error_file)):
        f.feed(line)
    assert lines[:-1] == report_lines(str(error_file))  # torchrun's report, as it is
    assert lines[-1] == (f"error: the job failed: rank 5 exited with code 1 first, on host "
                         f"node7: ValueError: bad batch (error file: {error_file})\n")
    lines.clear()  # the file gone (another machine's disk): the traceback's last line
    f = AgentFailureSummary(lines.append)
    for line in report_lines(str(tmp_path / "elsewhere.json")):
        f.feed(line)
    assert "on host node7: ValueError: from the traceback (error file:" in lines[-1]


# --- what torchrun hands each process -------------------------------------------------------

@pytest.fixture(scope="module")
def static_job():
    """2 simulated nodes x 2, static launch; the world joined with env://, tcp://, file://."""
    result = launch("scripts/experiments/lesson5_env.py",
                    ["--init", "env,tcp,file", "--init-port", str(free_port()),
                     "--timeout", "60"],
                    nproc=2, nnodes=2, timeout=180, cwd=str(ROOT), capture=True, echo=False,
                    backend="gloo")
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def c10d_job():
    """2 simulated nodes x 1, meeting by c10d rendezvous: no --node-rank."""
    result = launch("scripts/experiments/lesson5_env.py", ["--timeout", "60"], nproc=1, nnodes=2,
                    timeout=180, cwd=str(ROOT), capture=True, echo=False, backend="gloo",
                    rdzv="c10d")
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_static_launch_every_variable_once_in_rank_order(static_job):
    out = static_job.stdout
    port = re.search(r"--master-port=(\d+)", " ".join(static_job.args[0])).group(1)
    assert "launch: static rendezvous: each agent was told its node rank (--node-rank)" in out
    assert f"store: node 0's agent hosts it at 127.0.0.1:{port}" in out
    rows = parse_table(out)
    assert [(r["rank"], r["RANK"], r["LOCAL_RANK"], r["GROUP_RANK"], r["ROLE_RANK"])
            for r in rows] == [("0", "0", "0", "0", "0"), ("1", "1", "1", "0", "1"),
                               ("2", "2", "0", "1", "2"), ("3", "3", "1", "1", "3")]
    assert rows[0]["agent pid"] == rows[1]["agent pid"] != rows[2]["agent pid"]
    assert shared(out) == {
        "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2",
        "ROLE_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
        "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert summary(out) == {"world_size": "4", "nodes": "2", "init": "env,tcp,file",
                            "backend": "gloo", "wall_s": summary(out)["wall_s"]}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_env_tcp_and_file_join_the_same_world(static_job):
    checks = [line for line in static_job.stdout.splitlines() if line.startswith("check: ")]
    init_port = static_job.args[0][static_job.args[0].index("--init-port") + 1]
    master_port = shared(static_job.stdout)["MASTER_PORT"]
    tail = " joined the same world of 4: dist.get_rank() == RANK in every process"
    passed = " (rank and world_size passed in)"
    assert checks == [
        "check: init_method='env://'" + tail,
        f"check: init_method='tcp://127.0.0.1:{init_port}'" + passed + tail,
        f"check: init_method='file://{ROOT}/runs/lesson5_init_{master_port}'" + passed + tail]
    assert not (ROOT / "runs" / f"lesson5_init_{master_port}").exists()  # the store removed it


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_c10d_rendezvous_numbers_the_nodes_and_opens_a_new_store(c10d_job):
    out = c10d_job.stdout
    endpoint = re.search(r"--rdzv-endpoint=(\S+)", " ".join(c10d_job.args[0])).group(1)
    port = endpoint.rsplit(":", 1)[1]
    assert (f"launch: c10d rendezvous at {endpoint}, run id job{port}, no --node-rank: the "
            "rendezvous numbered the agents, sorted by host name, then pid") in out
    variables = shared(out)
    assert variables["TORCHELASTIC_RUN_ID"] == f"job{port}"
    assert variables["MASTER_PORT"] != port  # not the endpoint: a store node 0 opened
    assert f"not at the rendezvous endpoint {endpoint}" in out
    rows = parse_table(out)
    assert [(r["RANK"], r["GROUP_RANK"]) for r in rows] == [("0", "0"), ("1", "1")]
    # who is node 0? On one host, the agent with the lower pid: the rendezvous sorts them
    assert int(rows[0]["agent pid"]) < int(rows[1]["agent pid"])
    assert summary(out)["world_size"] == "2"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_bad_init_method_is_one_line():
    result = run([PYTHON, "scripts/experiments/lesson5_env.py", "--init", "env,udp"], timeout=50)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "lesson5_env.py: error: --init takes env, tcp or file (or a comma-separated list of "
        "them), not 'env,udp' (--help lists the options)")
    assert result.stdout == ""


# --- the drills --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def drills(tmp_path_factory):
    logs = tmp_path_factory.mktemp("lesson5_logs")
    result = run([PYTHON, "scripts/experiments/lesson5_drills.py", "--jobs", "4", "--log-dir",
                  str(logs)],
                 timeout=400)
    lines = {}
    for line in result.stdout.splitlines():
        m = re.match(r"([a-z-]+): ", line)
        if m:
            lines[m.group(1)] = line
    return result, lines, logs


def took(line: str) -> float:
    return float(re.search(r"\(exit 1 after ([\d.]+) s\)", line).group(1))


# drill: (what the student sees, what to do), as the drill's line says them. Of torch's own
# messages only the stable parts: the exception's class, the address, port, interface or count
# the drill chose, the 5 s it set; the course's own lines (failing-rank's) whole.
EXPECTED = {
    "wrong-port": (r'"[^"]*\b5000 ?ms\b[^"]*\(127\.0\.0\.1, (\d+)\)[^"]*"',
                   "every node must be given node 0's"),
    "wrong-addr": (r'"[^"]*\b5000 ?ms\b[^"]*\(127\.0\.0\.1, 29500\)[^"]*"',
                   "127.0.0.1 is host 1 itself"),
    "never-joins": (r'"RendezvousTimeoutError\b[^"]*"', "start the agent on every node"),
    "nnodes-mismatch": (r'"DistStoreError\b[^"]*\b[12]/3\b[^"]*"', "the same --nnodes"),
    "ifname-missing": (r'"RuntimeError\b[^"]*\beth9\b[^"]*"', "name an interface the machine has"),
    "ifname-lo": (r'"[^"]*connectFullMesh[^"]*\b127\.0\.0\.1\b[^"]*"', "GLOO_SOCKET_IFNAME=eth0"),
    "port-in-use": (r'"DistNetworkError\b[^"]*\b(\d{4,5})\b[^"]*EADDRINUSE[^"]*"',
                    "pick a free --master-port"),
    "failing-rank": (r'"error: the job failed: rank 1 exited with code 1 first, on host \S+: '
                     r'RuntimeError: rank 1 on \S+ cannot train step 2: planted failure '
                     r'\(--fail-rank\) \(error file: \S+/attempt_0/1/error\.json\)"',
                     "read the root cause's error file"),
}
NEED_HOSTS = {"wrong-addr", "ifname-lo"}


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_drill_ends_in_seconds_with_the_line_to_act_on(drills, name):
    result, lines, _ = drills
    assert set(lines) == set(EXPECTED) | {"summary"}, result.stdout + result.stderr
    line = lines[name]
    if name in NEED_HOSTS and HOSTS_REASON:
        assert line == (f"{name}: skipped: {HOSTS_REASON.split(';')[0]} (this drill needs "
                        "separate hosts)")
        return
    seen, fix = EXPECTED[name]
    assert re.search(f" -> {seen}", line), line
    assert "Fix: " in line and fix in line.split("Fix: ", 1)[1]
    assert took(line) < 60  # ended by torch's own 5 s timeouts, not the drill's limit


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_drills_all_behave_and_say_what_was_done(drills):
    result, lines, _ = drills
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == (
        "8 drill(s), torch timeouts 5 s, at most 90 s each, 4 at a time")
    assert summary(result.stdout) == {"drills": "8", "as_expected": "8", "unexpected": "0"}
    typo = re.search(r"--master-port=(\d+) ->", lines["wrong-port"]).group(1)
    assert re.search(EXPECTED["wrong-port"][0], lines["wrong-port"]).group(1) == typo
    port = re.search(r"--master-port=(\d+) another program", lines["port-in-use"]).group(1)
    assert re.search(EXPECTED["port-in-use"][0], lines["port-in-use"]).group(1) == port


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_failing_rank_leaves_per_rank_logs_and_an_error_file(drills):
    result, _, logs = drills
    runs = list(logs.iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("none_")  # <run id>_<random>
    attempt = runs[0] / "attempt_0"
    assert sorted(p.name for p in attempt.iterdir() if p.is_dir()) == ["0", "1"]
    for local_rank in "01":
        assert (attempt / local_rank / "stdout.log").exists()
        assert (attempt / local_rank / "stderr.log").exists()
    # each rank's own output in its own file: rank 1 reached step 2, where it raised
    assert "rank 1: step 2" in (attempt / "1" / "stdout.log").read_text()
    assert "rank 1: step" not in (attempt / "0" / "stdout.log").read_text()
    error = json.loads((attempt / "1" / "error.json").read_text())["message"]
    assert error["message"].startswith("RuntimeError: rank 1 on ")
    stack = error["extraInfo"]["py_callstack"]  # lesson 3's step itself ran, not a copy
    assert 'lesson5_failing_rank.py", line' in stack and "lesson3_ddp.py" in stack
    assert "RuntimeError: rank 1 on" in (attempt / "1" / "stderr.log").read_text()
    out = result.stdout
    assert f"  logs: {attempt}/<local rank>/{{error.json,stderr.log,stdout.log}}, local ranks " \
           "0, 1" in out
    assert re.search(r"^  error file of local rank 1 \(the root cause\): RuntimeError: rank 1 "
                     r"on \S+ cannot train step 2: planted failure \(--fail-rank\) \(raised at "
                     r"scripts/experiments/lesson5_failing_rank\.py line \d+ in before_forward\)$",
                     out, re.M)
    # rank 0 failed too, waiting for rank 1 in the all-reduce: a consequence, said so (unless
    # torchrun's SIGTERM reached it before its own error, as a loaded machine once saw)
    assert ("  error file of local rank 0 (a consequence): " in out) == \
        (attempt / "0" / "error.json").exists()
    assert "(the root cause)" not in out.replace("error file of local rank 1 (the root cause)", "")
    assert ("  console: local rank(s) 0 only (--local-ranks-filter 0), each line prefixed "
            "[default<local rank>]:; the files keep every rank's output") in out


def test_the_drills_list_themselves_and_refuse_an_unknown_name():
    listed = run([PYTHON, "scripts/experiments/lesson5_drills.py", "--list"], timeout=30)
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == list(EXPECTED)
    wrong = run([PYTHON, "scripts/experiments/lesson5_drills.py", "--only", "typo"], timeout=30)
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert len(wrong.stderr.splitlines()) == 1
    assert wrong.stderr.startswith("lesson5_drills.py: error: argument --only: invalid choice: "
                                   "'typo'")


# --- the step: lesson 3's DDP with the model split over each process's devices --------------

@pytest.fixture(scope="module")
def split_and_lesson3(tmp_path_factory):
    """The step and lesson 3's script, one epoch each on 3 processes (an odd world)."""
    folder = tmp_path_factory.mktemp("lesson5_split")
    results = {}
    for script in ("lesson5_model_split", "lesson3_ddp"):
        result = launch(f"scripts/{script}.py", ["--epochs", "1", "--checkpoint",
                                                  str(folder / f"{script}.pt")],
                        nproc=3, timeout=180, cwd=str(ROOT), capture=True, echo=False,
                        backend="gloo")
        assert result.returncode == 0, result.stdout + result.stderr
        results[script] = result
    return results, folder


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_split_model_ends_with_lesson_3s_weights_bit_for_bit(split_and_lesson3):
    import torch

    results, folder = split_and_lesson3
    out = results["lesson5_model_split"].stdout
    # every process's two stages, printed once by rank 0 in rank order: on the CPU here
    assert [line for line in out.splitlines() if line.startswith("rank ")] == [
        f"rank {r}: stage 0 on cpu, stage 1 on cpu" for r in range(3)]
    assert ("global batch 255 = 3 process(es) x 85, lr 0.0996094 (256 does not split over 3 "
            "processes; rounded down)") in out.splitlines()
    split, ddp = summary(out), summary(results["lesson3_ddp"].stdout)
    assert (split["world_size"], split["devices_per_process"]) == ("3", "2")
    # the same arithmetic as lesson 3: the same loss and accuracy, the same weights
    assert (split["train_loss"], split["val_acc"]) == (ddp["train_loss"], ddp["val_acc"])
    weights = [list(torch.load(folder / f"{script}.pt", weights_only=False)["model"].values())
               for script in ("lesson5_model_split", "lesson3_ddp")]
    assert len(weights[0]) == len(weights[1]) > 50
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_step_refuses_what_it_cannot_split_in_one_line():
    for args, message in [(["--devices-per-process", "0"],
                           "lesson5_model_split.py: error: --devices-per-process must be between "
                           "1 and 8"),
                          (["--model", "test_vit", "--epochs", "0"],
                           "error: --model test_vit: the split cuts a timm ResNet (test_resnet, "
                           "resnet18, ...)")]:
        result = run([PYTHON, "scripts/lesson5_model_split.py", *args], timeout=100)
        assert result.returncode != 0, result.stdout
        errors = [line for line in result.stderr.splitlines() if "error" in line]
        assert errors and errors[0].startswith(message), result.stderr
        assert "Traceback" not in result.stderr


def test_the_split_follows_the_source_notes_layout():
    """2 nodes x 4 GPUs, 2 per process: local rank g drives GPUs 2g and 2g+1."""
    from ddpcourse.topology import layout

    assert [(p.global_rank, p.node, p.local_rank, p.gpus) for p in layout(2, 4, 2)] == [
        (0, 0, 0, (0, 1)), (1, 0, 1, (2, 3)), (2, 1, 0, (0, 1)), (3, 1, 1, (2, 3))]
    source = (ROOT / "scripts" / "lesson5_model_split.py").read_text()
    assert "pick_device(k * local_rank)" in source
    assert "DDP(model, device_ids=None)" in source


def test_scripts_keep_the_distributed_lines_in_sight():
    for script in ("lesson5_model_split.py", "experiments/lesson5_env.py"):
        text = Path(ROOT / "scripts" / script).read_text()
        assert "dist.init_process_group(" in text and "destroy_process_group()" in text, script
    # the failure demo plants its bug in lesson 3's step and runs that, rather than a copy
    failing = (ROOT / "scripts" / "experiments" / "lesson5_failing_rank.py").read_text()
    assert "@record" in failing and 'parents[1] / "lesson3_ddp.py"' in failing
    assert "init_process_group" not in failing
